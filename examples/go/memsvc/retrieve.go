package main

import (
	"encoding/json"
	"net/http"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

type retrieveBody struct {
	Query        []float32 `json:"query"`
	TopK         *int32    `json:"top_k"`
	Gather       bool      `json:"gather"`
	BasePosition int64     `json:"base_position"`
}

// retrieve: kvmem_retrieve over the agent's sealed blocks, then (gather)
// kvmem_gather of the selected blocks re-encoded at base_position.
func (s *service) retrieve(id string, r *http.Request) (any, error) {
	var b retrieveBody
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<20)).Decode(&b); err != nil {
		return nil, badRequest("invalid JSON: %v", err)
	}
	return s.withAgent(id, func(a *kvmem.Agent) (any, error) {
		p := kvmem.RetrieveDefaultParams()
		if b.TopK != nil {
			p.TopK = *b.TopK
		} else {
			p.TopK = 8
		}
		res, err := a.Retrieve(kvmem.F32Tensor(b.Query), p, nil)
		if err != nil {
			return nil, err
		}
		defer res.Close()
		blocks, scores, err := res.Get(0)
		if err != nil {
			return nil, err
		}
		nt, _ := res.NTokens(0)
		out := map[string]any{"n_tokens": nt}
		list := make([]map[string]any, len(blocks))
		for i, blk := range blocks {
			bi, err := a.BlockInfo(int(blk))
			if err != nil {
				return nil, err
			}
			ids, err := a.Tokens(bi.FirstToken, int64(bi.NTokens))
			if err != nil {
				return nil, err
			}
			list[i] = map[string]any{"block": blk, "score": scores[i], "first_token": bi.FirstToken, "n_tokens": bi.NTokens, "token_ids": ids}
		}
		out["blocks"] = list
		if b.Gather {
			k, v, m, err := a.GatherF32(blocks, b.BasePosition)
			if err != nil {
				return nil, err
			}
			sp := s.pool.Spec
			out["gathered"] = map[string]any{"shape": []int64{int64(sp.NLayers), m, int64(sp.NKVHeads), int64(sp.HeadDim)}, "k": k, "v": v}
		}
		return out, nil
	})
}
