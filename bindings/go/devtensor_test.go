package kvmem_test

// Device tensors (kvmem.h, "Device tensors"): the descriptor checks and the
// context's Vulkan objects. The handles are made up; real device memory is
// tested in C on lavapipe (tests/unit/test_device_tensors.c).

import (
	"errors"
	"strings"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

func TestDeviceTensorDescriptors(t *testing.T) {
	if err := kvmem.CheckDeviceTensor(kvmem.MemoryVulkan, 0, 0x1000, 0, 2*16*2*8*4, kvmem.F32, 2, 16, 2, 8); err != nil {
		t.Fatal(err)
	}
	err := kvmem.CheckDeviceTensor(kvmem.MemoryVulkan, 0, 0x1000, 4, 2*16*2*8*4, kvmem.F32, 2, 16, 2, 8)
	if !errors.Is(err, kvmem.ErrInvalidArg) || !strings.Contains(err.Error(), "reaches past") {
		t.Fatalf("a span past the allocation: %v", err)
	}
	if err := kvmem.CheckDeviceTensor(kvmem.MemoryCUDA, 0, 0, 0, 64, kvmem.F32, 4); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("handle 0: %v", err)
	}
}

func TestVulkanDeviceOnlyOnVulkan(t *testing.T) {
	ctx, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if _, err := ctx.VulkanDevice(); !errors.Is(err, kvmem.ErrUnsupported) {
		t.Fatalf("cpu context: %v", err)
	}
	vk, err := kvmem.NewContext(kvmem.ContextParams{Backend: "vulkan", NThreads: 1})
	if err != nil {
		t.Skipf("backend vulkan: %v", err)
	}
	defer vk.Close()
	d, err := vk.VulkanDevice()
	if err != nil || d.Instance == 0 || d.Device == 0 || d.Queue == 0 {
		t.Fatalf("%+v %v", d, err)
	}
}
