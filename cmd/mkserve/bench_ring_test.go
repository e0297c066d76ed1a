package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBenchRingFlags(t *testing.T) {
	o, err := parseRingBench([]string{"--seq", "16384,65536", "--ranks", "4", "--heads", "32", "--kv-heads", "8",
		"--head-dim", "128", "--causal", "--json"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.seqs) != 2 || o.seqs[1] != 65536 || len(o.ranks) != 1 || o.ranks[0] != 4 || o.vHeadDim != 128 ||
		!o.causal || !o.json || o.iters < 3 || o.repeat != 1 {
		t.Fatalf("parsed %+v", o)
	}
	if o, err := parseRingBench([]string{"--repeat", "4", "--spacer-mb", "24"}); err != nil || o.repeat != 4 || o.spacerMB != 24 {
		t.Fatalf("--repeat 4 --spacer-mb 24: %+v, %v", o, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--seq", "12x"}, "--seq"},
		{[]string{"--ranks", "9"}, "--ranks"},
		{[]string{"--ranks", "0"}, "--ranks"},
		{[]string{"--heads", "6", "--kv-heads", "4"}, "--kv-heads"},
		{[]string{"--head-dim", "300"}, "--head-dim"},
		{[]string{"--window", "64"}, "--causal"},
		{[]string{"--iters", "2"}, "--iters"},
		{[]string{"--repeat", "0"}, "--repeat"},
		{[]string{"--repeat", "2", "--spacer-mb", "-1"}, "--spacer-mb"},
		{[]string{"extra"}, "unexpected"},
	} {
		if _, err := parseRingBench(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// Without a GPU or library the command fails with one line and a non-zero
// exit code, and prints nothing on stdout.
func TestBenchRingNoGPU(t *testing.T) {
	t.Setenv("MKSERVE_KERNEL_LIB", t.TempDir()+"/no-such-libmkernel.so")
	code, out, errOut := runCLI([]string{"bench", "ring", "--seq", "1024", "--ranks", "2", "--causal", "--json"}, "")
	if code == 0 {
		t.Fatalf("exit 0 without a library; stdout %q", out)
	}
	if out != "" {
		t.Errorf("stdout %q, want nothing", out)
	}
	if strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "unavailable") {
		t.Errorf("stderr %q: want one line saying the backend is unavailable", errOut)
	}
}

func TestBenchRingJSONShape(t *testing.T) {
	var sb strings.Builder
	res := []ringBenchResult{{Seq: 16384, Ranks: 4, Heads: 32, KVHeads: 8, HeadDim: 128, VHeadDim: 128, Causal: true,
		Iters: 10, Ms: 5.5, SingleRankMs: 5, SeparateMs: 8, TFLOPs: 400}}
	if err := printRingBench(&sb, true, res); err != nil {
		t.Fatal(err)
	}
	var v []map[string]any
	if err := json.Unmarshal([]byte(sb.String()), &v); err != nil || strings.Count(sb.String(), "\n") != 1 {
		t.Fatalf("not one JSON array line: %q (%v)", sb.String(), err)
	}
	for _, k := range []string{"seq", "ranks", "ms", "buffers", "gather_ms", "double_buffer_ms", "single_rank_ms",
		"separate_ms", "tflops", "rel_err"} {
		if _, ok := v[0][k]; !ok {
			t.Errorf("JSON object lacks %q: %s", k, sb.String())
		}
	}
	sb.Reset()
	if err := printRingBench(&sb, false, res); err != nil || !strings.Contains(sb.String(), "separate_ms") {
		t.Errorf("table: %q (%v)", sb.String(), err)
	}
}

func TestRingSwitches(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want string
	}{
		{nil, ""},
		{[]string{"PATH=/bin", "MK_MOE_X=1", "HOME=/root"}, ""},
		{[]string{"MK_RING_READY=0", "PATH=/bin", "MK_RING_BULK=0", "XMK_RING_NO=1"}, "MK_RING_BULK=0 MK_RING_READY=0"},
	} {
		if got := ringSwitches(c.env); got != c.want {
			t.Errorf("ringSwitches(%q) = %q, want %q", c.env, got, c.want)
		}
	}
}
