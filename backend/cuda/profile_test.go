package cuda

import (
	"testing"
	"time"
)

// TestOpProfile checks the bookkeeping without a GPU: nothing is recorded
// while off, calls and times add up per op, the costliest comes first, and
// turning it on again clears it.
func TestOpProfile(t *testing.T) {
	be := &Backend{}
	be.prof.record("Linear", time.Millisecond)
	if got := be.OpProfile(); len(got) != 0 {
		t.Fatalf("recorded while off: %v", got)
	}
	be.ProfileOps(true)
	for range 3 {
		be.prof.record("RMSNorm", 10*time.Microsecond)
	}
	be.prof.record("Linear", time.Millisecond)
	got := be.OpProfile()
	if len(got) != 2 || got[0].Op != "Linear" || got[1].Calls != 3 || got[1].Total != 30*time.Microsecond {
		t.Fatalf("profile %+v", got)
	}
	be.ProfileOps(true)
	if got := be.OpProfile(); len(got) != 0 {
		t.Fatalf("not cleared: %v", got)
	}
}

// TestShortName: kernel names from their mangled forms.
func TestShortName(t *testing.T) {
	for _, c := range [][2]string{
		{"_ZN12_GLOBAL__N_115rmsnorm_f32_regILi0ELi2EEEvPf", "rmsnorm_f32_reg"},
		{"_ZN5mkmoe15moe_gemm_kernelILi16ELi64EEEvNS_8GemmArgsE", "moe_gemm_kernel"},
		{"_Z11gemv_kernelPfi", "gemv_kernel"},
		{"start", "start"},
		{"?", "?"},
		{"_ZN99short", "_ZN99short"},
	} {
		if got := shortName(c[0]); got != c[1] {
			t.Errorf("shortName(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}
