package main

import (
	"errors"
	"fmt"
	"net/http"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

func (s *service) persistable(op string) error {
	if !s.hasStore {
		return &httpError{http.StatusNotImplemented, "no_store", op + ": this service has no store (start it with KVMEM_STORE=DIR or a redis:// URL)"}
	}
	return nil
}

// persist: kvmem_agent_save / kvmem_agent_load through the pool's store
// only. The client names the agent (checked by kvmem), never a file.
func (s *service) persist(op, id string) (any, error) {
	if err := s.persistable(op); err != nil {
		return nil, err
	}
	return s.withEntry(id, func(e *agentEntry) (any, error) {
		a, _, err := s.open(e, id, false)
		if err != nil {
			return nil, err
		}
		if op == "save" {
			if err := a.Save(""); err != nil {
				return nil, err
			}
			out, err := info(a)
			if err == nil {
				out["saved"] = id
			}
			return out, err
		}
		if err := a.Load(""); err != nil {
			// what is wrong inside a damaged file stays in the service's log:
			// the client learns the kind of failure, not the file's content
			var ke *kvmem.Error
			if errors.As(err, &ke) && (ke.Code == kvmem.StatusFormat || ke.Code == kvmem.StatusCorrupt) {
				s.log.Printf("load '%s': %s", id, ke.Msg)
				what := "damaged"
				if ke.Code == kvmem.StatusFormat {
					what = "not a valid kvmem agent file"
				}
				return nil, &kvmem.Error{Code: ke.Code, Msg: fmt.Sprintf("agent '%s': the stored file is %s (details in the service log)", id, what)}
			}
			return nil, err
		}
		return info(a)
	})
}
