package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

// persist: kvmem_agent_save / kvmem_agent_load through the pool's store
// only. The client names the agent (checked by kvmem), never a file.
func (s *service) persist(op, id string, r *http.Request) (any, error) {
	if err := noBodyFields(op, r); err != nil {
		return nil, err
	}
	if s.storeDir == "" {
		return nil, &httpError{http.StatusNotImplemented, "no_store", op + ": this service has no store (start it with KVMEM_STORE_DIR=DIR)"}
	}
	return s.withAgent(id, func(a *kvmem.Agent) (any, error) {
		if op == "save" {
			if err := a.Save(""); err != nil {
				return nil, err
			}
			return info(a)
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

// noBodyFields: save and load take no body, or an empty object.
func noBodyFields(op string, r *http.Request) error {
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err != nil {
		return badRequest("%s: reading the body: %v", op, err)
	}
	if strings.TrimSpace(string(raw)) == "" {
		return nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return badRequest("%s takes no body fields: agents are kept in the store directory set when the service started", op)
	}
	if len(fields) > 0 {
		names := make([]string, 0, len(fields))
		for k := range fields {
			names = append(names, fmt.Sprintf("%q", k))
		}
		sort.Strings(names)
		return badRequest("%s takes no body fields (got %s): agents are kept in the store directory set when the service started",
			op, strings.Join(names, ", "))
	}
	return nil
}
