"""The shared scenario: the same calls as bindings/fixture/scenario.c, through
the binding, must give exactly what the C program recorded."""
from __future__ import annotations

import array

import numpy as np
import pytest

import kvmem
from scenario import AGENTS, BS, D, HKV, HQ, L, fixture, kv_lists, value


def append_turn(spec, agent, salt, g0, n, rotated, text):
    k, v = kv_lists(salt, g0, n)
    k = np.asarray(k, dtype=np.float32).reshape(L, n, HKV, D)
    v = np.asarray(v, dtype=np.float32).reshape(L, n, HKV, D)
    tokens = np.arange(salt * 1000 + g0, salt * 1000 + g0 + n, dtype=np.int32)
    tb = text.encode()
    offsets = [t * len(tb) // n for t in range(n)]
    positions = None
    if rotated:
        positions = np.arange(g0 + 100, g0 + 100 + n, dtype=np.int32)
        # one position per head row of K, rotated in place through the binding
        rows = np.broadcast_to(positions[None, :, None], (L, n, HKV)).astype(np.int32).ravel()
        kvmem.rope_apply(spec, k.reshape(-1, D), rows)
    agent.append(k, v, token_ids=tokens, text=text, token_text_offsets=offsets, positions=positions)


def f32(xs):
    return np.asarray(xs, dtype=np.float64).astype(np.float32)


def test_scenario_matches_c_fixture():
    fx = fixture()
    with kvmem.Context("cpu", n_threads=1) as ctx:
        spec = kvmem.ModelSpec(n_layers=L, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D, model_id="scenario")
        with ctx.pool_create(spec, block_size=BS, storage_dtype="f16") as pool:
            agents = {aid: pool.agent_open(aid) for aid, _, _ in AGENTS}
            done = {aid: 0 for aid, _, _ in AGENTS}
            for ti in range(3):
                for aid, salt, turns in AGENTS:
                    if ti < len(turns):
                        n, rot, text = turns[ti]
                        append_turn(spec, agents[aid], salt, done[aid], n, rot, text)
                        done[aid] += n
            for a in agents.values():
                a.flush()

            info = pool.get_info()
            assert info.n_agents == fx["pool"]["n_agents"]
            assert info.used_bytes == fx["pool"]["used_bytes"]
            assert pool.agent_ids() == fx["pool"]["agent_ids"]

            for aid, a in agents.items():
                want = fx["agents"][aid]
                ai = a.get_info()
                assert (ai.n_tokens, ai.n_blocks, ai.n_sealed, ai.bytes, ai.text_bytes) == (
                    want["n_tokens"], want["n_blocks"], want["n_sealed"], want["bytes"], want["text_bytes"])
                k, v = a.read()
                assert k.shape == (L, want["n_tokens"], HKV, D) and k.dtype == np.float32
                np.testing.assert_array_equal(k.ravel(), f32(want["k"]))
                np.testing.assert_array_equal(v.ravel(), f32(want["v"]))
                assert a.tokens() == want["tokens"]
                assert a.text() == want["text"]
                for b, wb in enumerate(want["blocks"]):
                    bi = a.block_info(b)
                    assert (bi.first_token, bi.n_tokens, bi.sealed) == (
                        wb["first_token"], wb["n_tokens"], wb["sealed"])
                    if wb["sealed"]:
                        mn, mx = a.block_aabb(b)
                        np.testing.assert_array_equal(mn.ravel(), f32(wb["aabb_min"]))
                        np.testing.assert_array_equal(mx.ravel(), f32(wb["aabb_max"]))

            # retrieval: the same query rows as the fixture program, then a gather at 50
            rq = np.array([[[[value(7, l, i, h, d, 7919, 2003) for d in range(D)] for h in range(HQ)]
                            for l in range(L)] for i in range(2)], dtype=np.float32)
            want = fx["retrieve"]
            res = agents["alice"].retrieve(rq, top_k=2)
            blocks, scores = res.get(0)
            assert res.n_sets == want["n_sets"] and res.n_tokens(0) == want["n_tokens"]
            assert list(blocks) == want["blocks"]
            np.testing.assert_array_equal(scores, f32(want["scores"]))
            np.testing.assert_array_equal(np.array(res.block_scores(0), np.float32), f32(want["block_scores"]))
            assert res.blocks_view(0)[0] == want["blocks"]
            gk, gv = agents["alice"].gather(blocks, 50)
            np.testing.assert_array_equal(gk.ravel(), f32(want["gather_k"]))
            np.testing.assert_array_equal(gv.ravel(), f32(want["gather_v"]))
            res = agents["bob"].retrieve(rq, top_k=1, scope=kvmem.SCOPE_PER_LAYER, result=res)
            assert res.n_sets == L
            for st, ws in enumerate(want["bob_per_layer"]):
                b2, s2 = res.get(st)
                assert list(b2) == ws["blocks"]
                np.testing.assert_array_equal(s2, f32(ws["scores"]))
            res.close()

            # bad input: the C status and message reach the caller, nothing changes
            errs = fx["errors"]
            alice = agents["alice"]
            before = alice.get_info().n_tokens
            k, v = kv_lists(9, 0, 3)
            k = np.asarray(k, np.float32).reshape(L, 3, HKV, D)
            v = np.asarray(v, np.float32).reshape(L, 3, HKV, D)
            v[1, 2, 0, 0] = np.nan
            with pytest.raises(kvmem.InvalidArgumentError) as ei:
                alice.append(k, v)
            assert ei.value.status == errs["append_nan"]["status"]
            assert ei.value.name == errs["append_nan"]["name"]
            assert ei.value.message == errs["append_nan"]["message"]
            assert alice.get_info().n_tokens == before

            with pytest.raises(kvmem.InvalidArgumentError) as ei:
                pool.agent_open("bad id!")
            assert ei.value.message == errs["open_bad_id"]["message"]
            with pytest.raises(kvmem.BusyError) as ei:
                pool.remove_agent("bob")
            assert (ei.value.status, ei.value.message) == (errs["remove_open"]["status"],
                                                          errs["remove_open"]["message"])
            with pytest.raises(kvmem.InvalidArgumentError) as ei:
                alice.read(13, 2, values=False)
            assert ei.value.message == errs["read_past_end"]["message"]
            assert isinstance(ei.value, ValueError)  # also the builtin family

            agents["bob"].close()
            agents["bob"].close()  # idempotent
            pool.remove_agent("bob")
            info = pool.get_info()
            assert (info.n_agents, info.used_bytes) == (fx["after_remove"]["n_agents"],
                                                       fx["after_remove"]["used_bytes"])
            with pytest.raises(kvmem.ClosedError):
                agents["bob"].get_info()
        assert alice.closed  # closing the pool closed its agents
    assert pool.closed and ctx.closed


def test_scenario_without_numpy_types():
    """The same first turn through array.array/bytes inputs and memoryview outputs."""
    fx = fixture()
    with kvmem.Context("cpu", 1) as ctx, ctx.pool_create(
            kvmem.ModelSpec(n_layers=L, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D),
            block_size=BS, storage_dtype="f16") as pool, pool.agent_open("alice") as a:
        k, v = kv_lists(1, 0, 5)
        a.append(array.array("f", k), bytes(array.array("f", v)), dtype="f32",
                 token_ids=array.array("i", range(1000, 1005)))
        a.flush()  # the unsealed tail is held in f32; sealed blocks in f16 as in the fixture
        out_k = bytearray(4 * L * 5 * HKV * D)
        rk, rv = a.read(k_out=memoryview(out_k).cast("f"), values=False)
        assert rv is None
        want = fx["agents"]["alice"]["k"]
        # fixture k is [L][14][HKV][D]; the first 5 tokens of each layer
        got = array.array("f", out_k)
        per = HKV * D
        exp = [want[(l * 14 + t) * per + j] for l in range(L) for t in range(5) for j in range(per)]
        assert list(got) == list(array.array("f", exp))
