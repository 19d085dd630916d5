package main

import "net/http"

// retrieve answers 501 until the Go binding has kvmem_retrieve.
func (s *service) retrieve(id string, r *http.Request) (any, error) {
	_ = id
	_ = r
	return nil, &httpError{501, "not_implemented", "this Go binding has no kvmem_retrieve yet"}
}
