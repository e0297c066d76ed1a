package metrics

import "github.com/prometheus/client_golang/prometheus"

// GraphCounts is what a backend that replays steps as CUDA graphs reports
// (backend/cuda's GraphStats, without importing it).
type GraphCounts struct {
	Eager, Captures, Replays, Diverged, Failed int64 // cumulative steps / events
	Live                                       int   // graphs held now
	ArenaBytes                                 int64 // device memory they share
	ReplayHostNs                               int64 // cumulative host time of the replays (GPU idle meanwhile)
}

// graphCollector reads GraphCounts at every scrape.
type graphCollector struct {
	read  func() GraphCounts
	descs map[string]*prometheus.Desc
}

var graphMetrics = []struct{ name, help string }{
	{"cuda_graph_eager_steps_total", "Steps of the CUDA backend run without a graph (not eligible, first step of a shape, eager-only shapes)."},
	{"cuda_graph_captures_total", "Decode-step shapes captured as CUDA graphs."},
	{"cuda_graph_replays_total", "Decode steps replayed from a CUDA graph."},
	{"cuda_graph_diverged_total", "Replays whose step did not match its capture (graph dropped, step run eagerly)."},
	{"cuda_graph_capture_failures_total", "Captures that failed (that shape then runs eagerly)."},
	{"cuda_graphs", "CUDA graphs held."},
	{"cuda_graph_memory_bytes", "Device memory of the arena the CUDA graphs share."},
	{"cuda_graph_replay_host_seconds_total", "Host time of the graph replays: the model's Go code re-run to refill the step's uploads before the launch, while the GPU waits."},
}

// RegisterGraphs registers collectors that report read() at each scrape,
// labelled model_name=model, under the mkserve: prefix.
func RegisterGraphs(reg prometheus.Registerer, model string, read func() GraphCounts) {
	c := &graphCollector{read: read, descs: map[string]*prometheus.Desc{}}
	for _, m := range graphMetrics {
		c.descs[m.name] = prometheus.NewDesc(prefix+m.name, m.help, nil, prometheus.Labels{"model_name": model})
	}
	reg.MustRegister(c)
}

// Describe implements prometheus.Collector.
func (c *graphCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *graphCollector) Collect(ch chan<- prometheus.Metric) {
	g := c.read()
	counter := func(name string, v int64) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v))
	}
	gauge := func(name string, v int64) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, float64(v))
	}
	counter("cuda_graph_eager_steps_total", g.Eager)
	counter("cuda_graph_captures_total", g.Captures)
	counter("cuda_graph_replays_total", g.Replays)
	counter("cuda_graph_diverged_total", g.Diverged)
	counter("cuda_graph_capture_failures_total", g.Failed)
	gauge("cuda_graphs", int64(g.Live))
	gauge("cuda_graph_memory_bytes", g.ArenaBytes)
	ch <- prometheus.MustNewConstMetric(c.descs["cuda_graph_replay_host_seconds_total"], prometheus.CounterValue,
		float64(g.ReplayHostNs)/1e9)
}
