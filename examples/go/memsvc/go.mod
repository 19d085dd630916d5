module github.com/kvmem/kvmem/examples/go/memsvc

go 1.19

require github.com/kvmem/kvmem/bindings/go v0.1.0

// the checkout's binding; without this line, go fetches the release tagged bindings/go/v0.1.0
replace github.com/kvmem/kvmem/bindings/go => ../../../bindings/go
