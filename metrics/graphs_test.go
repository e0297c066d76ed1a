package metrics

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRegisterGraphs: every scrape reads the backend's counts afresh.
func TestRegisterGraphs(t *testing.T) {
	reg := NewRegistry()
	g := GraphCounts{Eager: 3, Captures: 2, Replays: 40, Diverged: 1, Failed: 0, Live: 2, ArenaBytes: 1 << 20, ReplayHostNs: 2_500_000_000}
	RegisterGraphs(reg, "m", func() GraphCounts { return g })
	want := func(replays int) string {
		return `# HELP mkserve:cuda_graph_replays_total Decode steps replayed from a CUDA graph.
# TYPE mkserve:cuda_graph_replays_total counter
mkserve:cuda_graph_replays_total{model_name="m"} ` + strconv.Itoa(replays) + `
# HELP mkserve:cuda_graph_memory_bytes Device memory of the arena the CUDA graphs share.
# TYPE mkserve:cuda_graph_memory_bytes gauge
mkserve:cuda_graph_memory_bytes{model_name="m"} 1.048576e+06
# HELP mkserve:cuda_graph_replay_host_seconds_total Host time of the graph replays: the model's Go code re-run to refill the step's uploads before the launch, while the GPU waits.
# TYPE mkserve:cuda_graph_replay_host_seconds_total counter
mkserve:cuda_graph_replay_host_seconds_total{model_name="m"} 2.5
`
	}
	names := []string{"mkserve:cuda_graph_replays_total", "mkserve:cuda_graph_memory_bytes", "mkserve:cuda_graph_replay_host_seconds_total"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(40)), names...); err != nil {
		t.Fatal(err)
	}
	g.Replays = 41
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(41)), names...); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "mkserve:cuda_graphs", "mkserve:cuda_graph_captures_total",
		"mkserve:cuda_graph_diverged_total", "mkserve:cuda_graph_capture_failures_total", "mkserve:cuda_graph_eager_steps_total"); err != nil || n != 5 {
		t.Fatalf("%d series, %v", n, err)
	}
}
