package main

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func TestBenchAttentionFlags(t *testing.T) {
	o, err := parseAttnBench([]string{"--seq", "1024, 4096", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
		"--causal", "--json"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.seqs) != 2 || o.seqs[1] != 4096 || o.vHeadDim != 128 || !o.causal || !o.json || o.batch != 1 || o.iters < 10 {
		t.Fatalf("parsed %+v", o)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--seq", "12x"}, "--seq"},
		{[]string{"--seq", "0"}, "--seq"},
		{[]string{"--heads", "6", "--kv-heads", "4"}, "--kv-heads"},
		{[]string{"--head-dim", "300"}, "--head-dim"},
		{[]string{"--v-head-dim", "-1"}, "--v-head-dim"},
		{[]string{"--window", "64"}, "--causal"},
		{[]string{"--iters", "3"}, "--iters"},
		{[]string{"--batch", "0"}, "--batch"},
		{[]string{"--block-size", "-16"}, "--block-size"},
		{[]string{"--seq", "1000", "--block-size", "16"}, "multiple of --block-size"},
		{[]string{"--nope"}, "nope"},
		{[]string{"extra"}, "unexpected"},
	} {
		if _, err := parseAttnBench(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// Without a GPU or library the command fails with one line and a non-zero
// exit code, and prints nothing on stdout.
func TestBenchAttentionNoGPU(t *testing.T) {
	t.Setenv("MKSERVE_KERNEL_LIB", t.TempDir()+"/no-such-libmkernel.so")
	code, out, errOut := runCLI([]string{"bench", "attention", "--seq", "128", "--json"}, "")
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

func TestBenchAttentionJSONShape(t *testing.T) {
	o := &attnBenchOpts{batch: 1, attnShape: attnShape{heads: 32, kvHeads: 8, headDim: 128, vHeadDim: 128, causal: true}}
	if got, want := attnFLOPs(o, 1024), 4.0*1024*1024*32*128/2; got != want {
		t.Errorf("causal FLOPs %v, want %v", got, want)
	}
	o.causal = false
	if got, want := attnFLOPs(o, 1024), 4.0*1024*1024*32*128; got != want {
		t.Errorf("FLOPs %v, want %v", got, want)
	}
	o.causal, o.window = true, 512
	if got, want := attnFLOPs(o, 1024), 2.0*32*256*(512*513/2+512*512); math.Abs(got-want) > 1 {
		t.Errorf("window 512 FLOPs %v, want %v", got, want)
	}
	var sb strings.Builder
	res := []attnBenchResult{{Seq: 1024, Batch: 1, Heads: 32, KVHeads: 8, HeadDim: 128, VHeadDim: 128, Causal: true,
		Iters: 20, Ms: 0.5, TFLOPs: 137.4}}
	if err := printAttnBench(&sb, true, res); err != nil {
		t.Fatal(err)
	}
	var v []map[string]any
	if err := json.Unmarshal([]byte(sb.String()), &v); err != nil || strings.Count(sb.String(), "\n") != 1 {
		t.Fatalf("not one JSON array line: %q (%v)", sb.String(), err)
	}
	for _, k := range []string{"seq", "ms", "tflops", "batch", "heads", "kv_heads", "head_dim", "causal", "rel_err"} {
		if _, ok := v[0][k]; !ok {
			t.Errorf("JSON object lacks %q: %s", k, sb.String())
		}
	}
	sb.Reset()
	if err := printAttnBench(&sb, false, res); err != nil || !strings.Contains(sb.String(), "TFLOP/s") {
		t.Errorf("table: %q (%v)", sb.String(), err)
	}
}
