package safetensors

import "github.com/mkserve/mkserve/tensor"

// dtypeBits is the width in bits of one element of every dtype the
// safetensors format defines (the reference implementation's list,
// sub-byte microscaling types included). A dtype missing here is refused.
var dtypeBits = map[tensor.DType]uint64{
	tensor.Bool:   8,
	tensor.F4:     4,
	"F6_E2M3":     6,
	"F6_E3M2":     6,
	tensor.U8:     8,
	tensor.I8:     8,
	tensor.F8E5M2: 8,
	tensor.F8E4M3: 8,
	tensor.F8E8M0: 8,
	tensor.I16:    16,
	"U16":         16,
	tensor.F16:    16,
	tensor.BF16:   16,
	tensor.I32:    32,
	"U32":         32,
	tensor.F32:    32,
	"C64":         64,
	tensor.F64:    64,
	tensor.I64:    64,
	"U64":         64,
}

// DTypeBits is the width in bits of one element of d, or 0 when safetensors
// does not define d.
func DTypeBits(d tensor.DType) int { return int(dtypeBits[d]) }
