module github.com/kvmem/kvmem/examples/go/memsvc

go 1.19

require github.com/kvmem/kvmem/bindings/go v0.0.0

replace github.com/kvmem/kvmem/bindings/go => ../../../bindings/go
