package main

// Request bodies: every field has one type, anything else is refused (never
// converted); the binary tensor layout decodes to the same fields as JSON.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"regexp"
	"testing"
)

func refused(t *testing.T, route, ctype string, body []byte, code int, re string) {
	t.Helper()
	_, err := decodeRequest(route, ctype, body)
	var be *httpError
	if !errors.As(err, &be) || be.code != code || !regexp.MustCompile(re).MatchString(be.message) {
		t.Errorf("%s %.80q: got %v, want %d and %q", route, body, err, code, re)
	}
}

func js(v any) []byte {
	if s, ok := v.(string); ok {
		return []byte(s)
	}
	b, _ := json.Marshal(v)
	return b
}

func TestCodecWrongTypesAreRefusedNeverConverted(t *testing.T) {
	k := []float64{0.5, -1, 2}
	cases := []struct {
		route string
		body  any
		re    string
	}{
		{"append", map[string]any{"k": []bool{true, false}, "v": k}, `append: k must be an array of numbers \(float32\): element 0 is a boolean`},
		{"append", map[string]any{"k": []string{"1", "2"}, "v": k}, `k must be an array of numbers.*element 0 is a string \("1"\)`},
		{"append", `{"k": [1, null], "v": [1]}`, `element 1 is null`},
		{"append", map[string]any{"k": "1,2,3", "v": k}, `k must be an array of numbers \(float32\), not a string`},
		{"append", map[string]any{"k": nil, "v": k}, `k must be .* not null`},
		{"append", `{"k": [1e39], "v": [1]}`, `k element 0 \(1e39\) is not a finite float32`},
		{"append", `{"k": [1e400], "v": [1]}`, `not a finite float32`},
		{"append", map[string]any{"k": k, "v": k, "token_ids": []float64{1.5}}, `token_ids must be an array of 32-bit integers: element 0 is 1.5`},
		{"append", map[string]any{"k": k, "v": k, "token_ids": []int64{1 << 31}}, `element 0 is 2147483648`},
		{"append", map[string]any{"k": k, "v": k, "token_ids": []string{"7"}}, `element 0 is a string`},
		{"append", `{"k": [1], "v": [1], "token_ids": [1, null]}`, `element 1 is null`},
		{"append", map[string]any{"k": k, "v": k, "positions": []int64{-(1 << 31) - 1}}, `positions must be an array of 32-bit integers`},
		{"append", map[string]any{"k": k, "v": k, "text": 5}, `text must be a string, not a number`},
		{"append", map[string]any{"k": k, "v": k, "flush": "yes"}, `flush must be true or false, not a string`},
		{"append", map[string]any{"k": k, "v": k, "flush": 1}, `flush must be true or false, not a number`},
		{"append", map[string]any{"k": k, "v": k, "save": nil}, `save must be true or false, not null`},
		{"append", map[string]any{"k": k, "v": k, "expect_tokens": -1}, `expect_tokens must be an integer in \[0, \d+\], not -1`},
		{"append", map[string]any{"k": k, "v": k, "path": "/etc/passwd"}, `append: unknown field "path"`},
		{"append", map[string]any{"v": k}, `append: k is required`},
		{"append", []any{k, k}, `append: the body must be a JSON object, not an array`},
		{"append", `{"k": [1], "v": [1]} trailing`, `invalid JSON`},
		{"append", ``, `append: k is required`},
		{"retrieve", map[string]any{"query": k, "top_k": "3"}, `top_k must be an integer in \[0, 65536\], not a string \("3"\)`},
		{"retrieve", map[string]any{"query": k, "top_k": 1.5}, `top_k must be an integer .* not 1.5`},
		{"retrieve", map[string]any{"query": k, "top_k": 1 << 32}, `top_k must be an integer .* not 4294967296`},
		{"retrieve", map[string]any{"query": k, "gather": "true"}, `gather must be true or false`},
		{"retrieve", map[string]any{"query": k, "base_position": -1}, `base_position must be an integer in \[0, 2147483647\]`},
		{"retrieve", map[string]any{"query": k, "base_position": 1 << 31}, `base_position must be an integer`},
		{"retrieve", map[string]any{"top_k": 1}, `retrieve: query is required`},
		{"flush", map[string]any{"now": true}, `flush takes no body fields \(got "now"\)`},
		{"save", map[string]any{"path": "/tmp/x"}, `save takes no body fields \(got "path"\)`},
		{"save", `"evil.kvm"`, `save takes no body fields`},
	}
	for _, c := range cases {
		refused(t, c.route, "", js(c.body), 400, c.re)
	}
}

func TestCodecGoodBodiesDecodeToTypedSlices(t *testing.T) {
	f, err := decodeRequest("append", "application/json; charset=utf-8", js(map[string]any{"k": []float64{0.5, -1}, "v": []float64{1, 2},
		"token_ids": []int64{-(1 << 31), 1<<31 - 1}, "text": "hi", "flush": false, "save": true, "expect_tokens": 0}))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.f32s("k"), []float32{0.5, -1}) || !reflect.DeepEqual(f.i32s("token_ids"), []int32{math.MinInt32, math.MaxInt32}) ||
		f.str("text") != "hi" || f.flag("flush") || !f.flag("save") || f.integer("expect_tokens", -1) != 0 {
		t.Fatalf("decoded %v", f)
	}
	// any Content-Type but the tensor layout's is read as JSON (curl -d sends form-urlencoded)
	if f, err := decodeRequest("append", "application/x-www-form-urlencoded", js(map[string]any{"k": []int{1}, "v": []int{2}})); err != nil ||
		!reflect.DeepEqual(f.f32s("v"), []float32{2}) {
		t.Fatalf("form-urlencoded JSON: %v %v", f, err)
	}
	for _, route := range []string{"flush", "save"} {
		if f, err := decodeRequest(route, "", nil); err != nil || len(f) != 0 {
			t.Fatalf("%s without a body: %v %v", route, f, err)
		}
	}
}

func TestCodecBinaryLayoutEqualsJSONAndItsFramingIsChecked(t *testing.T) {
	k, v, ids := []float32{0.25, -3, 1e-7, 65504}, []float32{1, 2, 3, 4}, []int32{7, -8}
	body := tensorBody(map[string]any{"text": "ab", "flush": true}, []string{"k", "v", "token_ids"}, k, v, ids)
	fromBin, err := decodeRequest("append", ctTensors, body)
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, err := decodeRequest("append", "", js(map[string]any{"k": k, "v": v, "token_ids": ids, "text": "ab", "flush": true}))
	if err != nil || !reflect.DeepEqual(fromBin, fromJSON) {
		t.Fatalf("binary %v, JSON %v (%v)", fromBin, fromJSON, err)
	}
	mixed := tensorBody(map[string]any{"token_ids": []int{7, -8}}, []string{"k", "v"}, k, v)
	if f, err := decodeRequest("append", ctTensors, mixed); err != nil || !reflect.DeepEqual(f.i32s("token_ids"), ids) {
		t.Fatalf("inline ids in the header: %v %v", f, err)
	}

	hdr := func(h any, data []byte) []byte {
		hb := js(h)
		return append(append(binary.LittleEndian.AppendUint64(nil, uint64(len(hb))), hb...), data...)
	}
	d := func(over map[string]any) map[string]any {
		m := map[string]any{"dtype": "F32", "shape": []int{4}, "data_offsets": []int{0, 16}}
		for k, v := range over {
			m[k] = v
		}
		return m
	}
	z := make([]byte, 16)
	refused(t, "append", ctTensors, []byte{1, 2, 3}, 400, `starts with its header's length \(8 bytes\), got 3 bytes`)
	refused(t, "append", ctTensors, binary.LittleEndian.AppendUint64(nil, 1<<63), 400, `header length 9223372036854775808 exceeds the body`)
	refused(t, "append", ctTensors, hdr([]int{1}, z), 400, `header must be a JSON object`)
	refused(t, "append", ctTensors, hdr(map[string]any{"k": d(map[string]any{"data_offsets": []int{0, 32}}), "v": d(nil)}, z), 400,
		`data_offsets must be \[BEGIN, END\] with 0 <= BEGIN <= END <= 16`)
	refused(t, "append", ctTensors, hdr(map[string]any{"k": d(map[string]any{"data_offsets": []int{8, 4}}), "v": d(nil)}, z), 400, `data_offsets must be`)
	refused(t, "append", ctTensors, hdr(map[string]any{"k": d(map[string]any{"shape": []int{5}}), "v": d(nil)}, z), 400,
		`data_offsets span 16 bytes, shape \[5\] needs 20`)
	refused(t, "append", ctTensors, hdr(map[string]any{"k": d(map[string]any{"dtype": "F16"}), "v": d(nil)}, z), 400, `append: k: dtype must be "F32"`)
	refused(t, "append", ctTensors, hdr(map[string]any{"k": d(nil), "v": d(nil), "token_ids": d(nil)}, z), 400, `token_ids: dtype must be "I32"`)
	refused(t, "append", ctTensors, hdr(map[string]any{"k": d(map[string]any{"shape": []int{-4}}), "v": d(nil)}, z), 400,
		`shape must be an array of at most 8 non-negative integers`)
	refused(t, "append", ctTensors, hdr(map[string]any{"k": d(map[string]any{"offsets": 1}), "v": d(nil)}, z), 400, `unknown descriptor field "offsets"`)
	nan := make([]byte, 16)
	binary.LittleEndian.PutUint32(nan[4:], math.Float32bits(float32(math.NaN())))
	refused(t, "append", ctTensors, hdr(map[string]any{"k": d(nil), "v": d(nil)}, nan), 400, `k element 1 \(NaN\) is not a finite float32`)
	// a descriptor is a tensor only in the binary layout
	refused(t, "append", "", js(map[string]any{"k": d(nil), "v": d(nil)}), 400, `k must be an array of numbers \(float32\), not a object`)
}

func TestCodecAnswerLayoutRoundTripsAndTheJSONBoundHolds(t *testing.T) {
	k, v := []float32{1, -2, 3.5, 4}, []float32{5, 6, 7, -8e-30}
	out := map[string]any{"blocks": []any{map[string]any{"block": 0}}, "gathered": map[string]any{"shape": []int{1, 2, 1, 2}, "k": k, "v": v}}
	header, parts := tensorAnswer(out)
	var buf []byte
	buf = append(buf, header...)
	for _, p := range parts {
		for _, x := range p {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
		}
	}
	got := readTensorBody(t, buf)
	g := got["gathered"].(map[string]any)
	if !reflect.DeepEqual(g["k"], k) || !reflect.DeepEqual(g["v"], v) || len(got["blocks"].([]any)) != 1 {
		t.Fatalf("round trip: %v", got)
	}
	worst := make([]float32, 1000)
	for i := range worst {
		worst[i] = -float32(1.2345678e-38 * (float64(i) + 1.1))
	}
	b, _ := json.Marshal(map[string]any{"blocks": []any{}, "gathered": map[string]any{"shape": []int{}, "k": worst, "v": worst}})
	if int64(len(b)) > responseBound(false, 2000, 0, 0) {
		t.Fatalf("%d bytes of JSON over the bound %d", len(b), responseBound(false, 2000, 0, 0))
	}
}
