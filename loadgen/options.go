package loadgen

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Endpoints Options.Endpoint accepts.
const (
	EndpointCompletions = "completions" // POST /v1/completions with a text prompt
	EndpointChat        = "chat"        // POST /v1/chat/completions with one user message
)

// Limits on Options, so that a typo cannot start an unbounded run.
const (
	MaxPrompts = 1_000_000 // Options.NumPrompts at most
	MaxLength  = 1 << 20   // prompt and output lengths at most, in tokens
)

// Options describe one benchmark run.
type Options struct {
	BaseURL string // server root, e.g. "http://127.0.0.1:8000" (a trailing "/v1" is accepted)
	Model   string // "model" field of each request; omitted when empty
	APIKey  string // sent as "Authorization: Bearer ..." when set

	Endpoint    string  // EndpointCompletions or EndpointChat ("" means completions)
	NumPrompts  int     // requests to send, 1..MaxPrompts
	RequestRate float64 // mean requests per second, Poisson arrivals; 0 or +Inf sends all at once
	// MaxConcurrency caps the requests in flight (0: no cap). Arrivals that
	// find the cap reached wait, in order, for a free slot.
	MaxConcurrency int

	PromptLen Dist // prompt length in (roughly) tokens: that many words
	OutputLen Dist // max_tokens of each request, sent with ignore_eos

	Seed    int64         // seeds prompts, lengths and arrival times
	Timeout time.Duration // per-request limit (0: none beyond ctx)

	// Sampling parameters sent with every request; nil fields are left
	// out (the server's defaults, e.g. a model's generation_config).
	Temperature *float64 // [0, 2]
	TopP        *float64 // (0, 1]
	TopK        *int     // >= 0 (0: off)

	// JSONObject sends response_format {"type": "json_object"} (and no
	// ignore_eos: a constrained choice ends when its object closes, so
	// OutputLen is then an upper bound): the cost of constrained decoding
	// against the same load without it.
	JSONObject bool
	// JSONSchema, when set (a JSON Schema object), sends response_format
	// {"type": "json_schema"} with it instead (and no ignore_eos).
	JSONSchema json.RawMessage
	// Grammar, when set (GBNF source), sends vLLM's guided_grammar with it
	// instead (and no ignore_eos).
	Grammar string
}

// DistKind names a length distribution.
type DistKind int

// Distribution kinds.
const (
	DistFixed   DistKind = iota // always Lo
	DistUniform                 // uniform integer in [Lo, Hi]
	DistNormal                  // round(normal(Mean, Std)), clipped to [Lo, Hi]
)

// Dist is a distribution of lengths in tokens. Build one with Fixed, Uniform,
// Normal or ParseDist; the zero Dist is invalid.
type Dist struct {
	Kind      DistKind
	Lo, Hi    int     // bounds (Fixed: Lo == Hi is the value)
	Mean, Std float64 // Normal only
}

// Fixed is always n.
func Fixed(n int) Dist { return Dist{Kind: DistFixed, Lo: n, Hi: n} }

// Uniform draws integers uniformly from [lo, hi].
func Uniform(lo, hi int) Dist { return Dist{Kind: DistUniform, Lo: lo, Hi: hi} }

// Normal draws round(N(mean, std²)) clipped to [max(1, mean-3std), mean+3std].
func Normal(mean, std float64) Dist {
	lo := max(1, int(math.Ceil(mean-3*std)))
	hi := max(lo, int(math.Floor(mean+3*std)))
	return Dist{Kind: DistNormal, Lo: lo, Hi: hi, Mean: mean, Std: std}
}

// ParseDist reads a length distribution: "N" (fixed), "LO:HI" or
// "uniform:LO:HI", and "normal:MEAN:STD".
func ParseDist(s string) (Dist, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	bad := func(why string) (Dist, error) {
		return Dist{}, fmt.Errorf("length distribution %q: %s (want N, LO:HI, uniform:LO:HI or normal:MEAN:STD)", s, why)
	}
	atoi := func(p string) (int, bool) {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		return n, err == nil
	}
	var d Dist
	switch {
	case len(parts) == 1:
		n, ok := atoi(parts[0])
		if !ok {
			return bad("not an integer")
		}
		d = Fixed(n)
	case len(parts) == 2 || (len(parts) == 3 && strings.EqualFold(parts[0], "uniform")):
		lo, ok1 := atoi(parts[len(parts)-2])
		hi, ok2 := atoi(parts[len(parts)-1])
		if !ok1 || !ok2 {
			return bad("bounds are not integers")
		}
		d = Uniform(lo, hi)
	case len(parts) == 3 && strings.EqualFold(parts[0], "normal"):
		mean, err1 := strconv.ParseFloat(strings.TrimSpace(parts[1]), 64)
		std, err2 := strconv.ParseFloat(strings.TrimSpace(parts[2]), 64)
		if err1 != nil || err2 != nil {
			return bad("mean and std are not numbers")
		}
		if math.IsNaN(mean) || math.IsNaN(std) || math.IsInf(mean, 0) || math.IsInf(std, 0) {
			return bad("mean and std must be finite")
		}
		if std < 0 || mean < 1 || mean > MaxLength || std > MaxLength {
			return bad(fmt.Sprintf("need 1 <= mean <= %d and 0 <= std <= %d", MaxLength, MaxLength))
		}
		d = Normal(mean, std)
	default:
		return bad("unknown form")
	}
	if err := d.validate(); err != nil {
		return bad(err.Error())
	}
	return d, nil
}

func (d Dist) validate() error {
	switch d.Kind {
	case DistFixed, DistUniform, DistNormal:
	default:
		return fmt.Errorf("unknown kind %d", d.Kind)
	}
	if d.Lo < 1 || d.Hi < d.Lo || d.Hi > MaxLength {
		return fmt.Errorf("bounds [%d, %d] outside 1 <= lo <= hi <= %d", d.Lo, d.Hi, MaxLength)
	}
	if d.Kind == DistFixed && d.Lo != d.Hi {
		return fmt.Errorf("fixed length with lo %d != hi %d", d.Lo, d.Hi)
	}
	if d.Kind == DistNormal && (!(d.Std >= 0) || math.IsNaN(d.Mean)) {
		return fmt.Errorf("normal with mean %v, std %v", d.Mean, d.Std)
	}
	return nil
}

// Sample draws one length.
func (d Dist) Sample(r *rand.Rand) int {
	switch d.Kind {
	case DistUniform:
		return d.Lo + r.IntN(d.Hi-d.Lo+1)
	case DistNormal:
		v := math.Round(d.Mean + d.Std*r.NormFloat64())
		return int(min(max(v, float64(d.Lo)), float64(d.Hi)))
	default:
		return d.Lo
	}
}

// String is the ParseDist form of d.
func (d Dist) String() string {
	switch d.Kind {
	case DistUniform:
		return fmt.Sprintf("uniform:%d:%d", d.Lo, d.Hi)
	case DistNormal:
		return fmt.Sprintf("normal:%g:%g", d.Mean, d.Std)
	default:
		return strconv.Itoa(d.Lo)
	}
}

// endpointURL is the full URL of the endpoint o names.
func (o *Options) endpointURL() (string, error) {
	u, err := url.Parse(o.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("base URL %q: want http(s)://host[:port][/path]", o.BaseURL)
	}
	base := strings.TrimRight(u.String(), "/")
	base = strings.TrimSuffix(base, "/v1")
	if o.Endpoint == EndpointChat {
		return base + "/v1/chat/completions", nil
	}
	return base + "/v1/completions", nil
}

// validate checks o and fills defaults.
func (o *Options) validate() error {
	if o.Endpoint == "" {
		o.Endpoint = EndpointCompletions
	}
	if o.Endpoint != EndpointCompletions && o.Endpoint != EndpointChat {
		return fmt.Errorf("endpoint %q: want %q or %q", o.Endpoint, EndpointCompletions, EndpointChat)
	}
	if _, err := o.endpointURL(); err != nil {
		return err
	}
	if o.NumPrompts < 1 || o.NumPrompts > MaxPrompts {
		return fmt.Errorf("num prompts %d: want 1..%d", o.NumPrompts, MaxPrompts)
	}
	if math.IsNaN(o.RequestRate) || o.RequestRate < 0 {
		return fmt.Errorf("request rate %v: want >= 0 (0 or +Inf: all at once)", o.RequestRate)
	}
	if o.MaxConcurrency < 0 {
		return fmt.Errorf("max concurrency %d: want >= 0 (0: no cap)", o.MaxConcurrency)
	}
	if err := o.PromptLen.validate(); err != nil {
		return fmt.Errorf("prompt length: %w", err)
	}
	if err := o.OutputLen.validate(); err != nil {
		return fmt.Errorf("output length: %w", err)
	}
	if o.Timeout < 0 {
		return fmt.Errorf("timeout %v: want >= 0 (0: none)", o.Timeout)
	}
	if t := o.Temperature; t != nil && !(*t >= 0 && *t <= 2) {
		return fmt.Errorf("temperature %v: want 0..2", *t)
	}
	if p := o.TopP; p != nil && !(*p > 0 && *p <= 1) {
		return fmt.Errorf("top-p %v: want (0, 1]", *p)
	}
	if k := o.TopK; k != nil && *k < 0 {
		return fmt.Errorf("top-k %d: want >= 0 (0: off)", *k)
	}
	if o.JSONSchema != nil {
		var m map[string]any
		if o.JSONObject || json.Unmarshal(o.JSONSchema, &m) != nil {
			return errors.New("json schema: want one JSON object, and not with json_object")
		}
	}
	if o.Grammar != "" && (o.JSONObject || o.JSONSchema != nil) {
		return errors.New("grammar: not with json_object or json_schema")
	}
	return nil
}
