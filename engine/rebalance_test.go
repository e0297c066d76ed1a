package engine_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
)

// TestExpertRebalancing: with expert parallelism on 4 emulated ranks and
// rebalancing every 2 steps, the engine installs new placements (replicas
// of hot experts) while serving, and greedy output stays what it is
// without rebalancing: a placement changes where experts run, not what
// they compute.
func TestExpertRebalancing(t *testing.T) {
	dir := testModel
	tok, prompts := testPrompts(t, 3, 41, 12, 5)
	run := func(every int) ([][]int32, engine.Stats) {
		be := cpu.New(cpu.Options{EPRanks: 4})
		l, err := models.Load(dir, be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(l.Model, be, tok, engine.Config{BlockSize: 4, RebalanceEvery: every}, engine.Options{Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, e)
		p := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true, TopP: 1, RepetitionPenalty: 1}
		var out [][]int32
		for _, pr := range prompts {
			out = append(out, collect(t, mustGen(t, e, pr, p)).tokens[0])
		}
		return out, waitIdle(t, e)
	}
	plain, st0 := run(0)
	moved, st := run(2)
	for i := range plain {
		if !slices.Equal(plain[i], moved[i]) || len(moved[i]) != 12 {
			t.Errorf("prompt %d: %v without rebalancing, %v with", i, plain[i], moved[i])
		}
	}
	if st0.ExpertPlacements != 0 {
		t.Errorf("rebalancing off, yet %d placements", st0.ExpertPlacements)
	}
	if st.ExpertPlacements == 0 {
		t.Errorf("rebalancing every 2 steps over %d steps installed no placement", st.Steps)
	}

	// Without expert parallelism there is nothing to rebalance.
	be := cpu.New(cpu.Options{})
	l, err := models.Load(dir, be, models.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.New(l.Model, be, tok, engine.Config{RebalanceEvery: 4}, engine.Options{}); err == nil ||
		!strings.Contains(err.Error(), "expert parallelism") {
		t.Errorf("rebalance without EP: %v, want an error naming expert parallelism", err)
	}
}
