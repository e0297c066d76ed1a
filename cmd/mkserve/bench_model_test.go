package main

import (
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend/cuda"
)

// TestBenchModel runs `bench model` on the CPU with random weights in the
// golden Mixtral's shapes and checks the JSON rows and their arithmetic.
func TestBenchModel(t *testing.T) {
	code, out, errOut := runCLI([]string{"bench", "model", "--config", "../../models/testdata/golden/mixtral",
		"--backend", "cpu", "--batch", "1,3", "--context", "20", "--prefill", "33", "--steps", "3",
		"--hbm-gbps", "10", "--json"}, "")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rows []modelResult
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("output is not a JSON array: %v\n%s", err, out)
	}
	if len(rows) != 3 || rows[0].Kind != "prefill" || rows[1].Kind != "decode" || rows[2].Batch != 3 {
		t.Fatalf("rows: %+v", rows)
	}
	for _, r := range rows {
		if r.MS <= 0 || r.TokensPS <= 0 || r.WeightGB <= 0 {
			t.Errorf("%+v: a non-positive measurement", r)
		}
		if got := float64(r.Tokens) / r.MS * 1e3; (got-r.TokensPS)/got > 1e-9 {
			t.Errorf("%+v: tokens_per_s %v, tokens/ms gives %v", r, r.TokensPS, got)
		}
	}
	// --verify-tokens adds a verify row after each decode row.
	code, out, errOut = runCLI([]string{"bench", "model", "--config", "../../models/testdata/golden/mixtral",
		"--backend", "cpu", "--batch", "2", "--context", "20", "--prefill", "0", "--steps", "3", "--verify-tokens", "3", "--json"}, "")
	var vrows []modelResult
	if code != 0 || json.Unmarshal([]byte(out), &vrows) != nil || len(vrows) != 2 || vrows[1].Kind != "verify" ||
		vrows[1].Tokens != 8 || vrows[1].MS <= 0 {
		t.Fatalf("--verify-tokens: exit %d %s %s", code, out, errOut)
	}
	d := rows[1]
	if d.FloorMS <= 0 || (d.OverFloor-d.MS/d.FloorMS) > 1e-9 || (d.FloorMS-d.WeightGB/10*1e3) > 1e-9 {
		t.Errorf("decode floor arithmetic: %+v", d)
	}
	// One token chooses top-2 of 8 experts in every MoE layer; three
	// tokens between 2 and 6.
	if d.ExpertsPerLayer != 2 || rows[2].ExpertsPerLayer < 2 || rows[2].ExpertsPerLayer > 6 {
		t.Errorf("experts per layer: batch 1 %v (want 2), batch 3 %v (want 2..6)", d.ExpertsPerLayer, rows[2].ExpertsPerLayer)
	}
	// Batch 1 touches top-2 of 8 experts per layer, so fewer bytes than
	// prefill, which counts every weight.
	if d.WeightGB >= rows[0].WeightGB {
		t.Errorf("batch-1 decode touches %v GB, all weights are %v GB", d.WeightGB, rows[0].WeightGB)
	}
}

func TestBenchModelErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "model"}, "exactly one of"},
		{[]string{"bench", "model", "--config", "x", "--model", "y"}, "exactly one of"},
		{[]string{"bench", "model", "--config", "../../models/testdata/golden/mixtral", "--batch", "1,0", "--backend", "cpu"}, "positive integer"},
		{[]string{"bench", "model", "--config", "../../models/testdata/golden/mixtral", "--backend", "tpu"}, "not available"},
		{[]string{"bench", "model", "--config", t.TempDir(), "--backend", "cpu"}, "config.json"},
		{[]string{"bench", "nope"}, "unknown benchmark"},
		{[]string{"bench", "model", "--config", "../../models/testdata/golden/mixtral", "--backend", "cpu", "--temperature", "-1"}, "--temperature -1"},
		{[]string{"bench", "model", "--config", "../../models/testdata/golden/mixtral", "--backend", "cpu", "--top-k", "-2"}, "--top-k -2"},
		{[]string{"bench", "model", "--config", "../../models/testdata/golden/mixtral", "--backend", "cpu", "--top-p", "0"}, "--top-p 0"},
	} {
		code, _, errOut := runCLI(tc.args, "")
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want one line containing %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestStampTable: a stamped step's ops summed by name (costliest first,
// calls counted, ties in first-seen order) and listed in order.
func TestStampTable(t *testing.T) {
	st := []cuda.OpStamp{{Op: "Embed", NS: 2000}, {Op: "Linear", NS: 8000}, {Op: "Attention", NS: 11000},
		{Op: "Linear", NS: 7000}, {Op: "RMSNorm", NS: 2000}}
	by, seq := stampTable(st)
	want := []opTime{{"Linear", 2, 15}, {"Attention", 1, 11}, {"Embed", 1, 2}, {"RMSNorm", 1, 2}}
	if len(by) != len(want) {
		t.Fatalf("by op %v, want %v", by, want)
	}
	for i := range want {
		if by[i] != want[i] {
			t.Errorf("by op [%d] = %+v, want %+v", i, by[i], want[i])
		}
	}
	if len(seq) != len(st) || seq[3] != (opTime{"Linear", 1, 7}) {
		t.Errorf("sequence %v", seq)
	}
	if by, seq := stampTable(nil); len(by) != 0 || len(seq) != 0 {
		t.Errorf("no stamps: %v, %v", by, seq)
	}
}

// TestBenchModelWorld: `bench model --world 2` on the cpu backend (a real
// second process, the experts split) prints the same table as one process,
// marked with the world, and refuses --ep with a world.
func TestBenchModelWorld(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second process and loads the model twice")
	}
	t.Setenv(worldChildEnv, "1") // the second process is this binary acting as mkserve
	var out strings.Builder
	err := benchModel([]string{"--backend", "cpu", "--model", "../../models/default", "--batch", "1,2", "--context", "16",
		"--prefill", "8", "--steps", "2", "--world", "2", "--world-timeout", "90s", "--json"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	var rows []modelResult
	if err := json.Unmarshal([]byte(out.String()), &rows); err != nil || len(rows) != 3 {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	for _, r := range rows {
		if r.World != 2 || r.MS <= 0 {
			t.Errorf("row %+v: want world 2 and a positive time", r)
		}
	}
	if err := benchModel([]string{"--backend", "cpu", "--model", "m", "--world", "2", "--ep", "2"}, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "--ep 1") {
		t.Errorf("--world with --ep 2: %v", err)
	}
}

// TestBenchModelContexts: decode sequences that read distinct prefilled
// contexts route to more experts than sequences sharing one context
// (whose attention outputs nearly agree), and the rows report the contexts
// read. testdata/moe-contexts is a two-layer Qwen3-MoE shape with 64
// experts, top-8: eight independent tokens would choose ≈ 42 a layer.
func TestBenchModelContexts(t *testing.T) {
	epl := map[string]float64{}
	for _, n := range []string{"1", "8"} {
		code, out, errOut := runCLI([]string{"bench", "model", "--config", "testdata/moe-contexts",
			"--backend", "cpu", "--batch", "8", "--context", "64", "--prefill", "0", "--steps", "2", "--contexts", n,
			"--hbm-gbps", "10", "--json"}, "")
		if code != 0 {
			t.Fatalf("--contexts %s: exit %d: %s", n, code, errOut)
		}
		var rows []modelResult
		if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 {
			t.Fatalf("--contexts %s: %v\n%s", n, err, out)
		}
		if want, _ := strconv.Atoi(n); rows[0].Contexts != want {
			t.Errorf("--contexts %s: the row reports %d contexts", n, rows[0].Contexts)
		}
		epl[n] = rows[0].ExpertsPerLayer
	}
	if epl["1"] < 8 || epl["8"] > 64 || !(epl["8"] > epl["1"]+5) {
		t.Errorf("experts per layer: one shared context %v, eight contexts %v (want ≥ 5 more with eight)", epl["1"], epl["8"])
	}
	t.Logf("experts per layer at batch 8: one shared context %.1f, eight contexts %.1f", epl["1"], epl["8"])
}
