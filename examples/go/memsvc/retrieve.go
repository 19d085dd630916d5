package main

import (
	"fmt"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

// retrieve: kvmem_retrieve over the agent's sealed blocks, then (gather)
// kvmem_gather of the selected blocks re-encoded at base_position. The
// answer's size is bounded before the work (413 over the limit).
func (s *service) retrieve(id string, f fields, binary bool) (any, error) {
	return s.withEntry(id, func(e *agentEntry) (any, error) {
		a, _, err := s.open(e, id, false)
		if err != nil {
			return nil, err
		}
		p := kvmem.RetrieveDefaultParams()
		p.TopK = int32(f.integer("top_k", 8))
		res, err := a.Retrieve(kvmem.F32Tensor(f.f32s("query")), p, nil)
		if err != nil {
			return nil, err
		}
		defer res.Close()
		blocks, scores, err := res.Get(0)
		if err != nil {
			return nil, err
		}
		infos := make([]kvmem.BlockInfo, len(blocks))
		var nTok int64
		for i, blk := range blocks {
			if infos[i], err = a.BlockInfo(int(blk)); err != nil {
				return nil, err
			}
			nTok += int64(infos[i].NTokens)
		}
		sp := s.pool.Spec
		var floats int64
		if f.flag("gather") {
			floats = 2 * nTok * int64(sp.NLayers) * int64(sp.NKVHeads) * int64(sp.HeadDim)
		}
		if bound := responseBound(binary, floats, int64(len(blocks)), nTok); bound > s.cfg.MaxResponseBytes {
			hint := ""
			if f.flag("gather") && !binary {
				hint = ", or for the gathered tensors as " + ctTensors
			}
			return nil, &httpError{413, "too_large", fmt.Sprintf("the answer would take up to %d bytes, over the service's limit of %d: ask for fewer blocks (top_k)%s",
				bound, s.cfg.MaxResponseBytes, hint)}
		}
		nt, _ := res.NTokens(0)
		list := make([]map[string]any, len(blocks))
		for i, blk := range blocks {
			ids, err := a.Tokens(infos[i].FirstToken, int64(infos[i].NTokens))
			if err != nil {
				return nil, err
			}
			list[i] = map[string]any{"block": blk, "score": scores[i], "first_token": infos[i].FirstToken, "n_tokens": infos[i].NTokens, "token_ids": ids}
		}
		out := map[string]any{"n_tokens": nt, "blocks": list}
		if f.flag("gather") {
			k, v, m, err := a.GatherF32(blocks, f.integer("base_position", 0))
			if err != nil {
				return nil, err
			}
			out["gathered"] = map[string]any{"shape": []int64{int64(sp.NLayers), m, int64(sp.NKVHeads), int64(sp.HeadDim)}, "k": k, "v": v}
		}
		return out, nil
	})
}
