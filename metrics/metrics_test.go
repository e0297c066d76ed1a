package metrics

import (
	"io"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// names lists every metric family of this package as exposed.
var names = []string{
	"mkserve:num_requests_running",
	"mkserve:num_requests_waiting",
	"mkserve:kv_cache_usage_perc",
	"mkserve:prefix_cache_queries_total",
	"mkserve:prefix_cache_hits_total",
	"mkserve:prompt_tokens_total",
	"mkserve:generation_tokens_total",
	"mkserve:request_success_total",
	"mkserve:num_preemptions_total",
	"mkserve:context_parallel_tokens_total",
	"mkserve:moe_expert_placements_total",
	"mkserve:overlapped_steps_total",
	"mkserve:host_sampled_rows_total",
	"mkserve:spec_decode_num_draft_tokens_total",
	"mkserve:spec_decode_num_accepted_tokens_total", "mkserve:spec_decode_pauses_total",
	"mkserve:prediction_accepted_tokens_total", "mkserve:prediction_rejected_tokens_total",
	"mkserve:time_to_first_token_seconds",
	"mkserve:inter_token_latency_seconds",
	"mkserve:e2e_request_latency_seconds",
	"mkserve:request_queue_time_seconds",
	"mkserve:grammar_mask_seconds",
	"mkserve:moe_expert_tokens_total",
	"mkserve:moe_load_imbalance",
}

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// exercise moves every metric so each family has samples.
func exercise(m *Metrics, r *rand.Rand) {
	m.SetRunning(1 + r.IntN(10))
	m.SetWaiting(r.IntN(10))
	m.SetKVCacheUsage(r.Float64())
	m.PrefixCache(10+r.IntN(10), r.IntN(10))
	m.PromptTokens(1 + r.IntN(100))
	m.GenerationTokens(1 + r.IntN(100))
	m.RequestFinished("stop", time.Millisecond, 20*time.Millisecond, time.Second)
	m.InterTokenLatency(30 * time.Millisecond)
	m.Preemption()
	m.OverlappedStep()
	m.HostSampledRows(1 + r.IntN(4))
	m.SpecDecode(4+r.IntN(4), r.IntN(4))
	m.SpecPause()
	m.Prediction(r.IntN(8), r.IntN(3))
	m.GrammarMask(time.Duration(1+r.IntN(1000)) * time.Microsecond)
	m.ExpertPlacement()
	m.ExpertLoad(r.IntN(3), []int64{int64(r.IntN(5)), int64(1 + r.IntN(5)), 3})
}

func TestLint(t *testing.T) {
	reg := NewRegistry()
	m := New(reg, "tiny-moe")
	exercise(m, newRand(t))
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	colon := map[string]bool{}
	for _, p := range problems {
		// vLLM-style names carry a colon on purpose; promlint flags that
		// alone. Anything else is a real problem.
		if p.Text == "metric names should not contain ':'" && strings.HasPrefix(p.Metric, "mkserve:") {
			colon[p.Metric] = true
			continue
		}
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	for _, n := range names {
		if !colon[n] {
			t.Errorf("%s: not exposed (or not linted)", n)
		}
	}
	if len(colon) != len(names) {
		t.Errorf("%d mkserve: families exposed, want %d", len(colon), len(names))
	}
}

func TestModelLabel(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, "qwen3-moe-tiny")
	exercise(m, newRand(t))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != len(names) {
		t.Fatalf("%d families, want %d", len(mfs), len(names))
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			if got := label(s, "model_name"); got != "qwen3-moe-tiny" {
				t.Errorf("%s: model_name=%q", mf.GetName(), got)
			}
		}
	}
}

func label(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestValues(t *testing.T) {
	r := newRand(t)
	reg := prometheus.NewRegistry()
	m := New(reg, "m")

	running, waiting, frac := r.IntN(100), r.IntN(100), r.Float64()
	m.SetRunning(running)
	m.SetWaiting(waiting)
	m.SetKVCacheUsage(frac)
	if got := testutil.ToFloat64(m.running); got != float64(running) {
		t.Errorf("running %v, want %d", got, running)
	}
	if got := testutil.ToFloat64(m.waiting); got != float64(waiting) {
		t.Errorf("waiting %v, want %d", got, waiting)
	}
	if got := testutil.ToFloat64(m.kvUsage); got != frac {
		t.Errorf("kv usage %v, want %v", got, frac)
	}

	var q, h, p, g, pre int
	for range 1 + r.IntN(20) {
		dq, dh, dp, dg := r.IntN(1000), r.IntN(1000), r.IntN(1000), r.IntN(1000)
		m.PrefixCache(dq, dh)
		m.PromptTokens(dp)
		m.GenerationTokens(dg)
		m.Preemption()
		q, h, p, g, pre = q+dq, h+dh, p+dp, g+dg, pre+1
	}
	m.PromptTokens(-5) // ignored: counters never go down
	for _, c := range []struct {
		name string
		c    prometheus.Collector
		want int
	}{
		{"prefix queries", m.prefixQueries, q},
		{"prefix hits", m.prefixHits, h},
		{"prompt tokens", m.promptTokens, p},
		{"generation tokens", m.genTokens, g},
		{"preemptions", m.preemptions, pre},
	} {
		if got := testutil.ToFloat64(c.c); got != float64(c.want) {
			t.Errorf("%s %v, want %d", c.name, got, c.want)
		}
	}

	// Finished requests by reason, and histogram sums and counts.
	reasons := map[string]int{}
	var sumQ, sumT, sumE float64
	var nT int
	for range 1 + r.IntN(30) {
		reason := finishReasons[r.IntN(len(finishReasons))]
		queue := time.Duration(r.IntN(1e9))
		ttft := time.Duration(r.IntN(3e9)) - time.Second // some ≤ 0: no token
		e2e := time.Duration(r.IntN(1e10))
		m.RequestFinished(reason, queue, ttft, e2e)
		reasons[reason]++
		sumQ += queue.Seconds()
		sumE += e2e.Seconds()
		if ttft > 0 {
			sumT += ttft.Seconds()
			nT++
		}
	}
	for _, reason := range finishReasons {
		if got := testutil.ToFloat64(m.success.WithLabelValues(reason)); got != float64(reasons[reason]) {
			t.Errorf("request_success{%s} %v, want %d", reason, got, reasons[reason])
		}
	}
	total := 0
	for _, n := range reasons {
		total += n
	}
	checkHist(t, "queue", m.queue, total, sumQ)
	checkHist(t, "ttft", m.ttft, nT, sumT)
	checkHist(t, "e2e", m.e2e, total, sumE)

	var sumI float64
	n := 1 + r.IntN(50)
	for range n {
		d := time.Duration(r.IntN(2e8))
		m.InterTokenLatency(d)
		sumI += d.Seconds()
	}
	m.InterTokenLatency(-time.Second) // ignored
	checkHist(t, "itl", m.itl, n, sumI)
}

func checkHist(t *testing.T, name string, h prometheus.Histogram, n int, sum float64) {
	t.Helper()
	var d dto.Metric
	if err := h.Write(&d); err != nil {
		t.Fatal(err)
	}
	if got := d.GetHistogram().GetSampleCount(); got != uint64(n) {
		t.Errorf("%s: count %d, want %d", name, got, n)
	}
	if got := d.GetHistogram().GetSampleSum(); math.Abs(got-sum) > 1e-9*math.Max(1, sum) {
		t.Errorf("%s: sum %v, want %v", name, got, sum)
	}
}

func TestBuckets(t *testing.T) {
	for _, b := range []struct {
		name string
		b    []float64
		n    int
		last float64
	}{
		{"ttft", ttftBuckets, 22, 2560},
		{"itl", interTokenBuckets, 19, 80},
		{"request", requestLatencyBuckets, 21, 7680},
	} {
		if len(b.b) != b.n || b.b[len(b.b)-1] != b.last {
			t.Errorf("%s: %d buckets ending %v, want %d ending %v", b.name, len(b.b), b.b[len(b.b)-1], b.n, b.last)
		}
		for i := 1; i < len(b.b); i++ {
			if b.b[i] <= b.b[i-1] {
				t.Errorf("%s: bucket %d (%v) not above %v", b.name, i, b.b[i], b.b[i-1])
			}
		}
	}
	// A 30 ms TTFT falls in the 0.04 bucket, not the 0.02 one.
	reg := prometheus.NewRegistry()
	m := New(reg, "m")
	m.RequestFinished("stop", 0, 30*time.Millisecond, time.Second)
	var d dto.Metric
	if err := m.ttft.Write(&d); err != nil {
		t.Fatal(err)
	}
	for _, b := range d.GetHistogram().GetBucket() {
		want := uint64(0)
		if b.GetUpperBound() >= 0.04 {
			want = 1
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
}

func TestExpertLoad(t *testing.T) {
	r := newRand(t)
	reg := prometheus.NewRegistry()
	m := New(reg, "m")
	const layers, experts = 3, 8
	var want [layers][experts]int64
	lastImb := [layers]float64{}
	for range 20 {
		l := r.IntN(layers)
		counts := make([]int64, experts)
		var total, most int64
		for e := range counts {
			counts[e] = int64(r.IntN(50))
			want[l][e] += counts[e]
			total += counts[e]
			most = max(most, counts[e])
		}
		m.ExpertLoad(l, counts)
		if total > 0 {
			lastImb[l] = float64(most) * experts / float64(total)
		}
	}
	for l := range layers {
		for e := range experts {
			got := testutil.ToFloat64(m.expertTokens.WithLabelValues(strconv.Itoa(l), strconv.Itoa(e)))
			if got != float64(want[l][e]) {
				t.Errorf("layer %d expert %d: %v tokens, want %d", l, e, got, want[l][e])
			}
		}
		if lastImb[l] == 0 {
			continue
		}
		if got := testutil.ToFloat64(m.imbalance.WithLabelValues(strconv.Itoa(l))); math.Abs(got-lastImb[l]) > 1e-12 {
			t.Errorf("layer %d imbalance %v, want %v", l, got, lastImb[l])
		}
	}

	// A balanced step gives 1; an all-zero step leaves the gauge alone;
	// negative counts count as 0; a layer with more experts grows.
	m.ExpertLoad(7, []int64{4, 4, 4, 4})
	m.ExpertLoad(7, []int64{0, 0, 0, 0})
	if got := testutil.ToFloat64(m.imbalance.WithLabelValues("7")); got != 1 {
		t.Errorf("balanced imbalance %v, want 1", got)
	}
	m.ExpertLoad(7, []int64{-3, 6, 0, 0, 2, 0})
	if got := testutil.ToFloat64(m.imbalance.WithLabelValues("7")); got != 6.0/(8.0/6) {
		t.Errorf("imbalance %v, want %v", got, 6.0/(8.0/6))
	}
	if got := testutil.ToFloat64(m.expertTokens.WithLabelValues("7", "0")); got != 4 {
		t.Errorf("expert 0 after a negative count: %v, want 4", got)
	}
	if got := testutil.CollectAndCount(m.expertTokens); got != layers*experts+6 {
		t.Errorf("%d expert series, want %d", got, layers*experts+6)
	}
	if got := testutil.CollectAndCount(m.imbalance); got != layers+1 {
		t.Errorf("%d imbalance series, want %d", got, layers+1)
	}
	m.ExpertLoad(9, nil) // no series
	if got := testutil.CollectAndCount(m.imbalance); got != layers+1 {
		t.Errorf("%d imbalance series after an empty step, want %d", got, layers+1)
	}
}

func TestSeriesCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "m")
	// request_success exists for every reason before any request finishes.
	if got := testutil.CollectAndCount(m.success); got != len(finishReasons) {
		t.Errorf("%d success series, want %d", got, len(finishReasons))
	}
	m.RequestFinished("", 0, 0, 0)
	if got := testutil.ToFloat64(m.success.WithLabelValues("unknown")); got != 1 {
		t.Errorf("empty reason counted %v times as unknown, want 1", got)
	}
	// 22 single-series families, no expert series yet, and the success
	// series of the four reasons plus "unknown".
	if got, err := testutil.GatherAndCount(reg); err != nil || got != 22+len(finishReasons)+1 {
		t.Errorf("%d series (%v), want %d", got, err, 22+len(finishReasons)+1)
	}
}

func TestNilReceiver(t *testing.T) {
	var m *Metrics
	exercise(m, newRand(t))
	m.ExpertLoad(0, nil)
}

func TestConcurrent(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "m")
	const workers, iters, experts = 8, 200, 16
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			counts := make([]int64, experts)
			for i := range iters {
				// Grow the expert list concurrently with other writers.
				n := 1 + (w+i)%experts
				for e := range n {
					counts[e] = 1
				}
				m.ExpertLoad(i%4, counts[:n])
				m.PromptTokens(2)
				m.GenerationTokens(1)
				m.PrefixCache(3, 1)
				m.RequestFinished(finishReasons[i%len(finishReasons)], time.Millisecond, time.Millisecond, time.Second)
				m.InterTokenLatency(time.Millisecond)
				m.SetRunning(i)
				m.Preemption()
				_, _ = reg.Gather()
			}
		})
	}
	wg.Wait()
	if got := testutil.ToFloat64(m.promptTokens); got != 2*workers*iters {
		t.Errorf("prompt tokens %v, want %d", got, 2*workers*iters)
	}
	if got := testutil.ToFloat64(m.preemptions); got != workers*iters {
		t.Errorf("preemptions %v, want %d", got, workers*iters)
	}
	// Expert e of any layer gets a token from every call with n > e.
	var want, got float64
	for w := range workers {
		for i := range iters {
			want += float64(1 + (w+i)%experts)
		}
	}
	for l := range 4 {
		for e := range experts {
			got += testutil.ToFloat64(m.expertTokens.WithLabelValues(strconv.Itoa(l), strconv.Itoa(e)))
		}
	}
	if got != want {
		t.Errorf("expert tokens %v, want %v", got, want)
	}
}

func TestHandler(t *testing.T) {
	reg := NewRegistry()
	m := New(reg, "tiny")
	m.GenerationTokens(42)
	srv := httptest.NewServer(Handler(reg))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	for _, want := range []string{
		`mkserve:generation_tokens_total{model_name="tiny"} 42`,
		`mkserve:request_success_total{finished_reason="stop",model_name="tiny"} 0`,
		"go_goroutines ",
		"process_cpu_seconds_total ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("content type %q", ct)
	}
}

func TestDuplicateRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg, "a")
	defer func() {
		if recover() == nil {
			t.Error("second New on the same registry did not panic")
		}
	}()
	New(reg, "a")
}

func BenchmarkExpertLoad(b *testing.B) {
	m := New(prometheus.NewRegistry(), "m")
	counts := make([]int64, 128)
	for i := range counts {
		counts[i] = int64(i % 7)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m.ExpertLoad(i%48, counts)
	}
}

func BenchmarkRequestFinished(b *testing.B) {
	m := New(prometheus.NewRegistry(), "m")
	b.ReportAllocs()
	for b.Loop() {
		m.RequestFinished("stop", time.Millisecond, 20*time.Millisecond, time.Second)
		m.InterTokenLatency(30 * time.Millisecond)
		m.GenerationTokens(1)
	}
}

// TestRegisterWeights: the weights' bytes by form, forms without bytes
// left out.
func TestRegisterWeights(t *testing.T) {
	reg := prometheus.NewRegistry()
	RegisterWeights(reg, "m", map[string]int64{"bf16": 1000, "fp4": 250, "q8": 0})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "form" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	if len(got) != 2 || got["bf16"] != 1000 || got["fp4"] != 250 {
		t.Errorf("weights_bytes by form: %v", got)
	}
}
