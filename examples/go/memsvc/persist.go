package main

import (
	"encoding/json"
	"net/http"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

// persist: kvmem_agent_save / kvmem_agent_load with {path}.
func (s *service) persist(op, id string, r *http.Request) (any, error) {
	var b struct {
		Path string `json:"path"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20)).Decode(&b); err != nil {
		return nil, badRequest("invalid JSON: %v", err)
	}
	return s.withAgent(id, func(a *kvmem.Agent) (any, error) {
		if op == "save" {
			if err := a.Save(b.Path); err != nil {
				return nil, err
			}
			return map[string]any{"saved": b.Path}, nil
		}
		if err := a.Load(b.Path); err != nil {
			return nil, err
		}
		return info(a)
	})
}
