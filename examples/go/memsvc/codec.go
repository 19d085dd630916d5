package main

// Request bodies in, response bodies out: typed checks of every field, and
// the binary tensor layout beside JSON (the same as the Node service's
// lib/codec.js, documented in docs/reliability.md).
//
// A body is the binary tensor layout (Content-Type application/x-kvmem-tensors)
// or JSON (any other Content-Type, or none):
//
//	bytes 0..8        N, unsigned 64-bit little-endian: the header's length
//	bytes 8..8+N      the header: a JSON object with the request's fields, as
//	                  in a JSON body, where a tensor field (k, v, query,
//	                  token_ids, token_text_offsets, positions) may instead be
//	                  {"dtype": "F32" | "I32", "shape": [...], "data_offsets": [BEGIN, END]}
//	bytes 8+N..       the data: each tensor's little-endian values at
//	                  [BEGIN, END) of this section, END - BEGIN = 4 x the
//	                  shape's product (safetensors' framing and descriptors)
//
// A retrieve whose request says Accept: application/x-kvmem-tensors gets its
// answer in the same layout, gathered.k and gathered.v as F32 descriptors.
//
// Every field has one type; a value of another type is refused (400), never
// converted: no strings for numbers, no 0/1 for booleans, no null, no
// fractions for integers, no float beyond float32's range, no unknown field.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"mime"
	"sort"
	"strconv"
	"strings"
)

const (
	ctJSON    = "application/json"
	ctTensors = "application/x-kvmem-tensors"
	maxHeader = 1 << 20
	// bytes one float takes at most in a JSON answer ("-1.2345678901234567e-45,"), and in a binary one
	jsonFloatBytes, binaryFloatBytes = 24, 4
)

type fieldKind int

const (
	kF32s fieldKind = iota
	kI32s
	kString
	kBool
	kInt
)

type fieldSpec struct {
	kind   fieldKind
	lo, hi int64
}

var routeFields = map[string]map[string]fieldSpec{
	"append": {
		"k": {kind: kF32s}, "v": {kind: kF32s}, "token_ids": {kind: kI32s}, "text": {kind: kString},
		"token_text_offsets": {kind: kI32s}, "positions": {kind: kI32s}, "flush": {kind: kBool}, "save": {kind: kBool},
		"expect_tokens": {kInt, 0, 1<<53 - 1},
	},
	"retrieve": {"query": {kind: kF32s}, "top_k": {kInt, 0, 65536}, "gather": {kind: kBool}, "base_position": {kInt, 0, math.MaxInt32}},
	"flush":    {}, "save": {}, "load": {},
}

var requiredFields = map[string][]string{"append": {"k", "v"}, "retrieve": {"query"}}

// fields is a decoded body: float32 and int32 slices, strings, booleans, int64s.
type fields map[string]any

func (f fields) f32s(k string) []float32 { v, _ := f[k].([]float32); return v }
func (f fields) i32s(k string) []int32   { v, _ := f[k].([]int32); return v }
func (f fields) str(k string) string     { v, _ := f[k].(string); return v }
func (f fields) flag(k string) bool      { v, _ := f[k].(bool); return v }
func (f fields) integer(k string, def int64) int64 {
	if v, ok := f[k].(int64); ok {
		return v
	}
	return def
}

// typeName describes a JSON value the way the Node service does
func typeName(raw json.RawMessage) string {
	s := bytes.TrimSpace(raw)
	if len(s) == 0 {
		return "nothing"
	}
	switch s[0] {
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '"':
		var str string
		_ = json.Unmarshal(s, &str)
		if len(str) > 20 {
			str = str[:20] + "..."
		}
		q, _ := json.Marshal(str)
		return "a string (" + string(q) + ")"
	case '[':
		return "an array"
	case '{':
		return "a object"
	}
	return "a number"
}

// number: a JSON number as float64, or ok false for any other JSON value
func number(raw json.RawMessage) (float64, bool) {
	s := bytes.TrimSpace(raw)
	if len(s) == 0 || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) {
		return 0, false
	}
	var x float64
	if err := json.Unmarshal(s, &x); err != nil {
		// beyond float64's range: a number all the same, out of every range here
		return math.Inf(1), true
	}
	return x, true
}

// array elements one by one: the slow path, for a message naming the element
func elements(raw json.RawMessage) ([]json.RawMessage, bool) {
	var els []json.RawMessage
	if err := json.Unmarshal(raw, &els); err != nil {
		return nil, false
	}
	return els, true
}

// numbers parses a JSON array of numbers in one pass, without reflection
// (faster than json.Unmarshal into []float32 alone); false for anything
// else, which the slow path then names.
func numbers(raw []byte, bits int, each func(x float64) bool) bool {
	i, n := 0, len(raw)
	ws := func() {
		for i < n && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	ws()
	if i >= n || raw[i] != '[' {
		return false
	}
	i++
	ws()
	if i < n && raw[i] == ']' {
		i++
		ws()
		return i == n
	}
	for {
		ws()
		j := i
		// JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
		if j < n && raw[j] == '-' {
			j++
		}
		if j < n && raw[j] == '0' {
			j++
		} else if j < n && raw[j] >= '1' && raw[j] <= '9' {
			for j < n && raw[j] >= '0' && raw[j] <= '9' {
				j++
			}
		} else {
			return false
		}
		// one digit or more at j: whether there were any
		digits := func() bool {
			k := j
			for j < n && raw[j] >= '0' && raw[j] <= '9' {
				j++
			}
			return j > k
		}
		if j < n && raw[j] == '.' {
			j++
			if !digits() {
				return false
			}
		}
		if j < n && (raw[j] == 'e' || raw[j] == 'E') {
			j++
			if j < n && (raw[j] == '+' || raw[j] == '-') {
				j++
			}
			if !digits() {
				return false
			}
		}
		x, err := strconv.ParseFloat(string(raw[i:j]), bits)
		if err != nil || !each(x) {
			return false
		}
		i = j
		ws()
		if i >= n {
			return false
		}
		if raw[i] == ']' {
			i++
			ws()
			return i == n
		}
		if raw[i] != ',' {
			return false
		}
		i++
	}
}

// checkNumbers: a JSON array of numbers as []T. fits says whether a number
// is a T; refusal words what went wrong with element i (isNum: it is a number).
func checkNumbers[T float32 | int32](raw json.RawMessage, name, what string, bits int, fits func(x float64) bool,
	refusal func(i int, e json.RawMessage, isNum bool) error) ([]T, error) {
	out := make([]T, 0, len(raw)/8)
	if numbers(raw, bits, func(x float64) bool { out = append(out, T(x)); return fits(x) }) {
		return out, nil
	}
	els, ok := elements(raw)
	if !ok {
		return nil, badRequest("%s must be %s, not %s", name, what, typeName(raw))
	}
	out = make([]T, len(els))
	for i, e := range els {
		x, isNum := number(e)
		if !isNum || !fits(x) {
			return nil, refusal(i, e, isNum)
		}
		out[i] = T(x)
	}
	return out, nil
}

func checkF32s(raw json.RawMessage, name string) ([]float32, error) {
	const what = "an array of numbers (float32)"
	return checkNumbers[float32](raw, name, what, 32, func(x float64) bool { return x >= -math.MaxFloat32 && x <= math.MaxFloat32 },
		func(i int, e json.RawMessage, isNum bool) error {
			if !isNum {
				return badRequest("%s must be %s: element %d is %s", name, what, i, typeName(e))
			}
			return badRequest("%s element %d (%s) is not a finite float32", name, i, bytes.TrimSpace(e))
		})
}

func checkI32s(raw json.RawMessage, name string) ([]int32, error) {
	const what = "an array of 32-bit integers"
	return checkNumbers[int32](raw, name, what, 64, func(x float64) bool { return x == math.Trunc(x) && x >= math.MinInt32 && x <= math.MaxInt32 },
		func(i int, e json.RawMessage, isNum bool) error {
			got := typeName(e)
			if isNum {
				got = string(bytes.TrimSpace(e))
			}
			return badRequest("%s must be %s: element %d is %s", name, what, i, got)
		})
}

// a tensor descriptor of the binary layout -> a slice over a copy of its bytes
func fromDescriptor(raw json.RawMessage, kind fieldKind, name string, data []byte) (any, error) {
	var d map[string]json.RawMessage
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, badRequest("%s: a tensor descriptor must be a JSON object", name)
	}
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != "dtype" && k != "shape" && k != "data_offsets" {
			return nil, badRequest("%s: unknown descriptor field %q (dtype, shape, data_offsets)", name, k)
		}
	}
	want := map[fieldKind]string{kF32s: "F32", kI32s: "I32"}[kind]
	var dtype string
	if err := json.Unmarshal(d["dtype"], &dtype); err != nil || dtype != want {
		return nil, badRequest("%s: dtype must be %q (got %s)", name, want, typeName(d["dtype"]))
	}
	shapeEls, ok := elements(d["shape"])
	n := int64(1)
	if !ok || len(shapeEls) > 8 {
		return nil, badRequest("%s: shape must be an array of at most 8 non-negative integers", name)
	}
	for _, e := range shapeEls {
		x, isNum := number(e)
		if !isNum || x != math.Trunc(x) || x < 0 || x > 1<<40 {
			return nil, badRequest("%s: shape must be an array of at most 8 non-negative integers", name)
		}
		if n = n * int64(x); n > 1<<40 {
			n = 1 << 40
		}
	}
	offEls, ok := elements(d["data_offsets"])
	var off [2]int64
	okOff := ok && len(offEls) == 2
	for i := 0; okOff && i < 2; i++ {
		x, isNum := number(offEls[i])
		okOff = isNum && x == math.Trunc(x) && x >= 0 && x <= float64(len(data))
		off[i] = int64(x)
	}
	if !okOff || off[0] > off[1] {
		return nil, badRequest("%s: data_offsets must be [BEGIN, END] with 0 <= BEGIN <= END <= %d (the data section's length)", name, len(data))
	}
	if off[1]-off[0] != n*4 {
		var dims []string
		for _, e := range shapeEls {
			dims = append(dims, string(bytes.TrimSpace(e)))
		}
		return nil, badRequest("%s: data_offsets span %d bytes, shape [%s] needs %d", name, off[1]-off[0], strings.Join(dims, ","), n*4)
	}
	b := data[off[0]:off[1]]
	if kind == kI32s {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out, nil
	}
	out := make([]float32, n)
	for i := range out {
		x := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		if !(x >= -math.MaxFloat32 && x <= math.MaxFloat32) {
			return nil, badRequest("%s element %d (%s) is not a finite float32", name, i, jsNumber(float64(x)))
		}
		out[i] = x
	}
	return out, nil
}

// jsNumber prints NaN and the infinities as JavaScript does, for messages
func jsNumber(x float64) string {
	switch {
	case math.IsNaN(x):
		return "NaN"
	case math.IsInf(x, 1):
		return "Infinity"
	case math.IsInf(x, -1):
		return "-Infinity"
	}
	return fmt.Sprint(x)
}

func checkField(route, name string, raw json.RawMessage, spec fieldSpec, data []byte) (any, error) {
	full := route + ": " + name
	trimmed := bytes.TrimSpace(raw)
	switch spec.kind {
	case kF32s, kI32s:
		if len(trimmed) > 0 && trimmed[0] == '[' {
			if spec.kind == kF32s {
				return checkF32s(trimmed, full)
			}
			return checkI32s(trimmed, full)
		}
		if data != nil && len(trimmed) > 0 && trimmed[0] == '{' {
			return fromDescriptor(trimmed, spec.kind, full, data)
		}
		what, alt := "an array of numbers (float32)", ""
		if spec.kind == kI32s {
			what = "an array of 32-bit integers"
		}
		if data != nil {
			alt = " or a tensor descriptor"
		}
		return nil, badRequest("%s must be %s%s, not %s", full, what, alt, typeName(raw))
	case kString:
		var s string
		if len(trimmed) == 0 || trimmed[0] != '"' || json.Unmarshal(trimmed, &s) != nil {
			return nil, badRequest("%s must be a string, not %s", full, typeName(raw))
		}
		return s, nil
	case kBool:
		switch string(trimmed) {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		return nil, badRequest("%s must be true or false, not %s", full, typeName(raw))
	case kInt:
		x, isNum := number(trimmed)
		if !isNum || x != math.Trunc(x) || x < float64(spec.lo) || x > float64(spec.hi) {
			what := typeName(raw)
			if isNum {
				what = string(trimmed)
			}
			return nil, badRequest("%s must be an integer in [%d, %d], not %s", full, spec.lo, spec.hi, what)
		}
		return int64(x), nil
	}
	return nil, fmt.Errorf("codec: no kind %d", spec.kind)
}

func noFields(route, got string) error {
	msg := route + " takes no body fields"
	if got != "" {
		msg += " (got " + got + ")"
	}
	if route != "flush" {
		msg += ": agents are kept in the store set when the service started"
	}
	return badRequest("%s", msg)
}

// decodeRequest: the fields of a body for route, checked; slices for tensors.
func decodeRequest(route, ctype string, body []byte) (fields, error) {
	spec, ok := routeFields[route]
	if !ok {
		return nil, fmt.Errorf("codec: no route %s", route)
	}
	mt := ""
	if ctype != "" {
		var err error
		if mt, _, err = mime.ParseMediaType(ctype); err != nil {
			mt = strings.ToLower(strings.TrimSpace(strings.Split(ctype, ";")[0]))
		}
	}
	var header []byte
	var data []byte
	switch mt {
	case ctTensors:
		if len(body) < 8 {
			return nil, badRequest("a %s body starts with its header's length (8 bytes), got %d bytes", ctTensors, len(body))
		}
		n := binary.LittleEndian.Uint64(body)
		if n > uint64(len(body)-8) || n > maxHeader {
			return nil, badRequest("the %s header length %d exceeds the body (%d bytes after it) or 1 MiB", ctTensors, n, len(body)-8)
		}
		header, data = body[8:8+n], body[8+n:]
		if data == nil {
			data = []byte{}
		}
	default: // any other Content-Type is read as JSON (curl -d sends form-urlencoded)
		header = body
	}
	var obj map[string]json.RawMessage
	if t := bytes.TrimSpace(header); len(t) == 0 && data == nil {
		obj = map[string]json.RawMessage{}
	} else if err := json.Unmarshal(t, &obj); err != nil || obj == nil {
		var v json.RawMessage
		if err := json.Unmarshal(t, &v); err != nil {
			if data != nil {
				return nil, badRequest("invalid JSON header: %v", err)
			}
			return nil, badRequest("invalid JSON: %v", err)
		}
		if data != nil {
			return nil, badRequest("the %s header must be a JSON object", ctTensors)
		}
		if len(spec) == 0 {
			return nil, noFields(route, "")
		}
		return nil, badRequest("%s: the body must be a JSON object, not %s", route, typeName(v))
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(spec) == 0 && len(keys) > 0 {
		q := make([]string, len(keys))
		for i, k := range keys {
			q[i] = fmt.Sprintf("%q", k)
		}
		return nil, noFields(route, strings.Join(q, ", "))
	}
	out := fields{}
	for _, k := range keys {
		fs, ok := spec[k]
		if !ok {
			names := make([]string, 0, len(spec))
			for n := range spec {
				names = append(names, n)
			}
			sort.Strings(names)
			return nil, badRequest("%s: unknown field %q (fields: %s)", route, k, strings.Join(names, ", "))
		}
		v, err := checkField(route, k, obj[k], fs, data)
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	for _, k := range requiredFields[route] {
		if _, ok := out[k]; !ok {
			return nil, badRequest("%s: %s is required", route, k)
		}
	}
	return out, nil
}

func acceptsTensors(accept string) bool { return strings.Contains(strings.ToLower(accept), ctTensors) }

// responseBound is an upper bound of a retrieve answer's bytes before it is
// made: nFloats gathered values and the blocks' token ids.
func responseBound(binary bool, nFloats, nBlocks, nTokenIDs int64) int64 {
	per := int64(jsonFloatBytes)
	if binary {
		per = binaryFloatBytes
	}
	return 256 + nBlocks*160 + nTokenIDs*12 + nFloats*per
}

// tensorAnswer writes obj in the binary layout: its []float32 values (at any
// depth of maps) become descriptors, their bytes the data section.
func tensorAnswer(obj map[string]any) ([]byte, [][]float32) {
	var parts [][]float32
	var off int64
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case []float32:
			d := map[string]any{"dtype": "F32", "shape": []int{len(x)}, "data_offsets": []int64{off, off + 4*int64(len(x))}}
			parts = append(parts, x)
			off += 4 * int64(len(x))
			return d
		case map[string]any:
			m := make(map[string]any, len(x))
			for k, e := range x {
				m[k] = walk(e)
			}
			return m
		}
		return v
	}
	header, _ := json.Marshal(walk(obj))
	out := make([]byte, 8, 8+len(header))
	binary.LittleEndian.PutUint64(out, uint64(len(header)))
	return append(out, header...), parts
}
