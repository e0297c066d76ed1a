package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/kernels"
)

// TestBenchMoEWorldFlags (CPU): --world's flags and defaults, and its
// errors before any process starts.
func TestBenchMoEWorldFlags(t *testing.T) {
	o, err := parseMoEBench([]string{"--world", "4"})
	if err != nil {
		t.Fatal(err)
	}
	if o.world.size != 4 || o.world.rank != 0 || o.shapes != moeEPDefaultShapes || o.checkRows != 4 ||
		len(o.tokens) != 4 || o.tokens[0] != 16 || o.tokens[3] != 4096 {
		t.Errorf("defaults: %+v", o)
	}
	sh, err := parseMoEShapes(o.shapes, o)
	if err != nil || len(sh) != 3 || sh[2].name != "deepseek_v3" || sh[2].routing != "grouped" || sh[1].experts != 8 {
		t.Errorf("shapes %+v: %v", sh, err)
	}
	o, err = parseMoEBench([]string{"--world", "2", "--world-rank", "1", "--coordinator", "127.0.0.1:5000",
		"--shapes", "tiny,custom", "--hidden", "512", "--experts", "16", "--topk", "2", "--routing", "softmax",
		"--tokens", "7", "--kernel-timeout", "3s"})
	if err != nil {
		t.Fatal(err)
	}
	sh, err = parseMoEShapes(o.shapes, o)
	if err != nil || len(sh) != 2 || sh[1].hidden != 512 || sh[1].experts != 16 || o.tokens[0] != 7 || o.world.coord != "127.0.0.1:5000" {
		t.Errorf("custom: %+v %+v: %v", o, sh, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--world", "9"}, "--world 9"},
		{[]string{"--world", "2", "--path", "grouped"}, "--path fused"},
		{[]string{"--world", "2", "--ranks", "2"}, "--ranks"},
		{[]string{"--world", "2", "--shared-experts", "1"}, "--shared-experts"},
		{[]string{"--world", "2", "--shapes", "llama"}, "unknown shape"},
		{[]string{"--world", "3", "--shapes", "custom", "--experts", "2", "--topk", "1", "--routing", "softmax"}, "every rank needs one"},
		{[]string{"--world", "2", "--kernel-timeout", "0s"}, "--kernel-timeout"},
		{[]string{"--shapes", "tiny"}, "for --world"},
		{[]string{"--world-rank", "1"}, "need --world"},
	} {
		_, err := parseMoEBench(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// TestPrintMoEEP (CPU): the table, the JSON lines and the `mk moe_ep`
// lines; an error above 1e-2 (or NaN) fails after printing.
func TestPrintMoEEP(t *testing.T) {
	rows := []moeEPRow{
		{Shape: "qwen3_30b_a3b", Tokens: 16, Ranks: 2, MS: 0.5, LocalMS: 0.4, VisibleComm: 0.2, RelErr: 3e-4, Iters: 5,
			PerRank: []moeEPRank{{Rank: 0, MS: 0.5, LocalMS: 0.4, RowsReceived: 130}, {Rank: 1, MS: 0.45, LocalMS: 0.41}}},
		{Shape: "qwen3_30b_a3b", Tokens: 256, Ranks: 2, MS: 1, LocalMS: 0.9, RelErr: 2e-4},
	}
	var out bytes.Buffer
	if err := printMoEEP(&out, &moeBenchOpts{iters: 5}, rows); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"mk moe_ep qwen3_30b_a3b 16 2 0.5000 0.4000 3.00e-04\n", "mk moe_ep qwen3_30b_a3b 256 2 1.0000 0.9000 2.00e-04\n", "20.0%", "130"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	out.Reset()
	if err := printMoEEP(&out, &moeBenchOpts{iters: 5, json: true}, rows); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("json: %d lines:\n%s", len(lines), out.String())
	}
	var r moeEPRow
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil || r.Tokens != 16 || len(r.PerRank) != 2 {
		t.Errorf("json line %q: %+v %v", lines[0], r, err)
	}
	rows[1].RelErr = 0.5
	if err := printMoEEP(&bytes.Buffer{}, &moeBenchOpts{iters: 5}, rows); err == nil || !strings.Contains(err.Error(), "256") {
		t.Errorf("rel err 0.5: %v", err)
	}
}

// TestBenchMoEWorldNoGPU: without libmkernel.so, --world fails with one
// line before starting any process. Skipped where a library is present.
func TestBenchMoEWorldNoGPU(t *testing.T) {
	if _, err := kernels.LibraryPath(); err == nil {
		t.Skip("a libmkernel.so is present; this checks the machine without one")
	}
	var log syncBuffer
	old := worldLog
	worldLog = &log
	t.Cleanup(func() { worldLog = old })
	var out, errb bytes.Buffer
	rc := run([]string{"bench", "moe", "--world", "2", "--shapes", "tiny"}, strings.NewReader(""), &out, &errb)
	if rc == 0 || strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 || !strings.Contains(errb.String(), "GPU") {
		t.Errorf("rc %d, stderr %q: want a one-line error naming the GPU", rc, errb.String())
	}
	if log.String() != "" {
		t.Errorf("a child ran: %q", log.String())
	}
}

// TestBenchMoEWorldGPU: `bench moe --world 2` on the tiny shape, its ranks
// in two processes (copies of this test binary acting as mkserve), on
// device rank mod GPUs (both on one GPU, their CTAs halved, when there is
// one): every case within 1e-2 of the reference, the JSON and mk lines.
// Skipped without libmkernel.so.
func TestBenchMoEWorldGPU(t *testing.T) {
	if _, err := kernels.LibraryPath(); err != nil {
		t.Skipf("no libmkernel.so: %v", err)
	}
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Setenv(worldChildEnv, "1")
	var log syncBuffer
	old := worldLog
	worldLog = &log
	t.Cleanup(func() { worldLog = old })
	var out, errb bytes.Buffer
	rc := run([]string{"bench", "moe", "--world", "2", "--shapes", "tiny", "--tokens", "1,16,70", "--iters", "3",
		"--kernel-timeout", "5s", "--world-timeout", "60s", "--json"}, strings.NewReader(""), &out, &errb)
	t.Logf("stdout:\n%sstderr:\n%schildren:\n%s", out.String(), errb.String(), log.String())
	if rc != 0 && strings.Contains(errb.String(), "needs a GPU") && os.Getenv("MKSERVE_REQUIRE_GPU") != "1" {
		t.Skipf("a library but no GPU: %s", errb.String())
	}
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	var rows []moeEPRow
	var mk int
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.HasPrefix(l, "mk moe_ep tiny ") {
			mk++
			continue
		}
		var r moeEPRow
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		rows = append(rows, r)
	}
	if len(rows) != 3 || mk != 3 {
		t.Fatalf("%d JSON rows and %d mk lines, want 3 and 3", len(rows), mk)
	}
	for _, r := range rows {
		if r.Ranks != 2 || len(r.PerRank) != 2 || !(r.RelErr <= 1e-2) || r.MS <= 0 || r.LocalMS <= 0 || r.RouteMismatch != 0 {
			t.Errorf("row %+v", r)
		}
		var recv int64
		for _, p := range r.PerRank {
			recv += p.RowsReceived
		}
		if want := int64(2 * r.Tokens * 4); recv != want { // every (token, k) row of both ranks, once
			t.Errorf("tokens %d: %d rows received over the ranks, want %d", r.Tokens, recv, want)
		}
	}
}
