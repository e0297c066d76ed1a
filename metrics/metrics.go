// Package metrics holds the server's Prometheus collectors: vLLM's engine
// metrics under an `mkserve:` prefix (so vLLM dashboards work after a
// rename), plus MoE expert-load statistics.
//
// The names contain a colon, as vLLM's do; promlint reports that as a
// problem ("reserved for recording rules") and nothing else.
package metrics

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// prefix starts every metric name of this package.
const prefix = "mkserve:"

// Histogram buckets, in seconds, as vLLM's.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	interTokenBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	gramMaskBuckets       = []float64{1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1}
	requestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
		20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// finishReasons are pre-created so every request_success series exists
// from the start (the engine's FinishStop, FinishLength, FinishAbort,
// FinishError; not imported, as the engine imports this package).
var finishReasons = []string{"stop", "length", "abort", "error"}

// Metrics records the engine's metrics. A nil *Metrics is valid and
// records nothing. All methods are safe for concurrent use.
type Metrics struct {
	running, waiting, kvUsage  prometheus.Gauge
	prefixQueries, prefixHits  prometheus.Counter
	promptTokens, genTokens    prometheus.Counter
	preemptions                prometheus.Counter
	cpTokens                   prometheus.Counter
	placements                 prometheus.Counter
	overlapped                 prometheus.Counter
	hostRows                   prometheus.Counter
	specDraft, specAccepted    prometheus.Counter
	specPauses                 prometheus.Counter
	predAccepted, predRejected prometheus.Counter
	success                    *prometheus.CounterVec // {finished_reason}
	ttft, itl, e2e, queue      prometheus.Histogram
	gramMask                   prometheus.Histogram
	expertTokens               *prometheus.CounterVec // {layer, expert}
	imbalance                  *prometheus.GaugeVec   // {layer}
	layersMu                   sync.RWMutex
	layers                     map[int]*layerSeries
}

// layerSeries caches one MoE layer's children so ExpertLoad does no label
// hashing on the hot path.
type layerSeries struct {
	mu        sync.Mutex
	experts   []prometheus.Counter // [expert]
	imbalance prometheus.Gauge
}

// New creates the collectors, each series labelled model_name=model, and
// registers them on reg. It panics if reg already holds collectors with
// these names (as prometheus.MustRegister does).
func New(reg prometheus.Registerer, model string) *Metrics {
	labels := prometheus.Labels{"model_name": model}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: prefix + name, Help: help, ConstLabels: labels})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: prefix + name, Help: help, ConstLabels: labels})
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: prefix + name, Help: help, ConstLabels: labels, Buckets: buckets})
	}
	m := &Metrics{
		running:       gauge("num_requests_running", "Number of requests in model execution batches."),
		waiting:       gauge("num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:       gauge("kv_cache_usage_perc", "KV-cache usage: the fraction of KV blocks in use, 0 to 1."),
		prefixQueries: counter("prefix_cache_queries_total", "Prefix cache queries, in tokens."),
		prefixHits:    counter("prefix_cache_hits_total", "Prefix cache hits, in tokens."),
		promptTokens:  counter("prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:     counter("generation_tokens_total", "Number of generation tokens processed."),
		preemptions:   counter("num_preemptions_total", "Cumulative number of preemptions from the engine."),
		cpTokens:      counter("context_parallel_tokens_total", "Prompt tokens prefilled with context parallelism (engine.context_parallel)."),
		placements:    counter("moe_expert_placements_total", "Expert placements of MoE layers installed by the rebalancer (engine.rebalance_every)."),
		overlapped:    counter("overlapped_steps_total", "Engine steps launched while the previous step's sampled tokens were still on the device (overlapped decode; engine.sync_steps turns it off)."),
		hostRows:      counter("host_sampled_rows_total", "Tokens sampled on the host though the backend samples on the device: a fork of n choices, prompt log-probabilities in the step, or log-probabilities asked of a row whose grammar (response_format, a forced tool call), logit_bias or min_tokens changes its logits."),
		specDraft:     counter("spec_decode_num_draft_tokens_total", "Draft tokens verified: from prompt lookup (engine.speculative_tokens) or a request's prediction."),
		specAccepted:  counter("spec_decode_num_accepted_tokens_total", "Draft tokens that matched the model's own greedy choice (accepted)."),
		specPauses:    counter("spec_decode_pauses_total", "Times prompt lookup paused for every sequence because decode steps delivered fewer tokens a second with it than during its latest pause."),
		predAccepted:  counter("prediction_accepted_tokens_total", "Draft tokens from requests' predictions (OpenAI's predicted outputs) that the model kept."),
		predRejected:  counter("prediction_rejected_tokens_total", "Draft tokens from requests' predictions that the model refused."),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "request_success_total", Help: "Count of finished requests by finish reason.", ConstLabels: labels,
		}, []string{"finished_reason"}),
		ttft:     histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:      histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", interTokenBuckets),
		e2e:      histogram("e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds.", requestLatencyBuckets),
		queue:    histogram("request_queue_time_seconds", "Histogram of time spent waiting in the queue in seconds.", requestLatencyBuckets),
		gramMask: histogram("grammar_mask_seconds", "Histogram of the time to compute one constrained choice's vocabulary mask (structured output: a JSON schema, regex, grammar or forced tool call), in seconds.", gramMaskBuckets),
		expertTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "moe_expert_tokens_total", Help: "Tokens routed to each expert of each MoE layer.", ConstLabels: labels,
		}, []string{"layer", "expert"}),
		imbalance: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "moe_load_imbalance", Help: "Max over mean tokens per expert of a MoE layer in its latest step (1: balanced).", ConstLabels: labels,
		}, []string{"layer"}),
		layers: map[int]*layerSeries{},
	}
	for _, r := range finishReasons {
		m.success.WithLabelValues(r)
	}
	reg.MustRegister(m.running, m.waiting, m.kvUsage, m.prefixQueries, m.prefixHits,
		m.promptTokens, m.genTokens, m.preemptions, m.cpTokens, m.placements, m.overlapped, m.hostRows, m.specDraft, m.specAccepted, m.specPauses, m.predAccepted, m.predRejected, m.success,
		m.ttft, m.itl, m.e2e, m.queue, m.gramMask, m.expertTokens, m.imbalance)
	return m
}

// NewRegistry returns a registry with the Go runtime and process
// collectors registered.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves reg in the Prometheus exposition formats (for /metrics).
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// SetRunning sets the number of requests in the running batch.
func (m *Metrics) SetRunning(n int) {
	if m == nil {
		return
	}
	m.running.Set(float64(n))
}

// SetWaiting sets the number of queued requests.
func (m *Metrics) SetWaiting(n int) {
	if m == nil {
		return
	}
	m.waiting.Set(float64(n))
}

// SetKVCacheUsage sets the fraction of KV blocks in use (0..1).
func (m *Metrics) SetKVCacheUsage(frac float64) {
	if m == nil {
		return
	}
	m.kvUsage.Set(frac)
}

// PrefixCache counts prompt tokens looked up in the prefix cache and
// those found. Negative counts are ignored.
func (m *Metrics) PrefixCache(queries, hits int) {
	if m == nil {
		return
	}
	addInt(m.prefixQueries, queries)
	addInt(m.prefixHits, hits)
}

// PromptTokens counts n prefilled prompt tokens.
func (m *Metrics) PromptTokens(n int) {
	if m == nil {
		return
	}
	addInt(m.promptTokens, n)
}

// GenerationTokens counts n generated tokens.
func (m *Metrics) GenerationTokens(n int) {
	if m == nil {
		return
	}
	addInt(m.genTokens, n)
}

// RequestFinished counts a finished request by reason (engine.Finish*) and
// observes its queue time, time to first token and end-to-end latency.
// A ttft ≤ 0 means the request produced no token and is not observed;
// negative queue or e2e durations are not observed either.
func (m *Metrics) RequestFinished(reason string, queue, ttft, e2e time.Duration) {
	if m == nil {
		return
	}
	if reason == "" {
		reason = "unknown"
	}
	m.success.WithLabelValues(reason).Inc()
	if queue >= 0 {
		m.queue.Observe(queue.Seconds())
	}
	if ttft > 0 {
		m.ttft.Observe(ttft.Seconds())
	}
	if e2e >= 0 {
		m.e2e.Observe(e2e.Seconds())
	}
}

// InterTokenLatency observes the time between two tokens of one choice.
func (m *Metrics) InterTokenLatency(d time.Duration) {
	if m == nil || d < 0 {
		return
	}
	m.itl.Observe(d.Seconds())
}

// Preemption counts one preempted request.
func (m *Metrics) Preemption() {
	if m == nil {
		return
	}
	m.preemptions.Inc()
}

// OverlappedStep counts one step launched before the previous step's
// tokens reached the host.
func (m *Metrics) OverlappedStep() {
	if m == nil {
		return
	}
	m.overlapped.Inc()
}

// SpecDecode counts draft tokens verified in a step and how many of them
// were accepted.
func (m *Metrics) SpecDecode(drafted, accepted int) {
	if m == nil || drafted == 0 {
		return
	}
	m.specDraft.Add(float64(drafted))
	m.specAccepted.Add(float64(accepted))
}

// Prediction counts a verify step's draft tokens from a request's
// prediction: kept and refused.
func (m *Metrics) Prediction(accepted, rejected int) {
	if m == nil {
		return
	}
	m.predAccepted.Add(float64(accepted))
	m.predRejected.Add(float64(rejected))
}

// SpecPause counts one pause of speculation by its cost check.
func (m *Metrics) SpecPause() {
	if m == nil {
		return
	}
	m.specPauses.Inc()
}

// GrammarMask records the time one vocabulary mask took.
func (m *Metrics) GrammarMask(d time.Duration) {
	if m == nil {
		return
	}
	m.gramMask.Observe(d.Seconds())
}

// HostSampledRows counts n rows sampled on the host in a step whose backend
// samples on the device.
func (m *Metrics) HostSampledRows(n int) {
	if m == nil || n == 0 {
		return
	}
	m.hostRows.Add(float64(n))
}

// ContextParallelTokens counts n prompt tokens of a context-parallel prefill chunk.
func (m *Metrics) ContextParallelTokens(n int) {
	if m == nil {
		return
	}
	m.cpTokens.Add(float64(n))
}

// ExpertPlacement counts one expert placement installed by the rebalancer.
func (m *Metrics) ExpertPlacement() {
	if m == nil {
		return
	}
	m.placements.Inc()
}

// ExpertLoad adds one step's tokens per expert [experts] of a MoE layer to
// moe_expert_tokens_total and sets moe_load_imbalance{layer} to max/mean
// of tokensPerExpert. A step with no tokens leaves the imbalance as it
// was; negative counts are treated as 0.
func (m *Metrics) ExpertLoad(layer int, tokensPerExpert []int64) {
	if m == nil || len(tokensPerExpert) == 0 {
		return
	}
	experts, imbalance := m.layer(layer, len(tokensPerExpert))
	var total, most int64
	for e, n := range tokensPerExpert {
		n = max(n, 0)
		experts[e].Add(float64(n))
		total += n
		most = max(most, n)
	}
	if total > 0 {
		mean := float64(total) / float64(len(tokensPerExpert))
		imbalance.Set(float64(most) / mean)
	}
}

// layer returns layer's expert counters (at least n) and imbalance gauge.
func (m *Metrics) layer(layer, n int) ([]prometheus.Counter, prometheus.Gauge) {
	m.layersMu.RLock()
	ls := m.layers[layer]
	m.layersMu.RUnlock()
	if ls == nil {
		m.layersMu.Lock()
		if ls = m.layers[layer]; ls == nil {
			ls = &layerSeries{imbalance: m.imbalance.WithLabelValues(strconv.Itoa(layer))}
			m.layers[layer] = ls
		}
		m.layersMu.Unlock()
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if len(ls.experts) < n {
		l := strconv.Itoa(layer)
		for e := len(ls.experts); e < n; e++ {
			ls.experts = append(ls.experts, m.expertTokens.WithLabelValues(l, strconv.Itoa(e)))
		}
	}
	// Elements below len never change, so the header copy is safe to use
	// after unlocking while others append.
	return ls.experts, ls.imbalance
}

func addInt(c prometheus.Counter, n int) {
	if n > 0 {
		c.Add(float64(n))
	}
}
