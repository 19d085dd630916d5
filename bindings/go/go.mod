module github.com/kvmem/kvmem/bindings/go

go 1.19
