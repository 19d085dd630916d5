package main

import "net/http"

// retrieve and persist answer 501 until the Go binding has kvmem_retrieve and
// kvmem_agent_save/load (files replaced when those land on main).
func (s *service) retrieve(id string, r *http.Request) (any, error) {
	_ = id
	_ = r
	return nil, &httpError{501, "not_implemented", "this Go binding has no kvmem_retrieve yet"}
}

func (s *service) persist(op, id string, r *http.Request) (any, error) {
	_ = id
	_ = r
	return nil, &httpError{501, "not_implemented", "this Go binding has no kvmem_agent_" + op + " yet"}
}
