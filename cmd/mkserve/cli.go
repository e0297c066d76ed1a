package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/tokenizer"
)

// run executes one command line and returns the process exit status;
// failures print exactly one line on stderr.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		if err := c.run(args[1:], stdin, stdout); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			fmt.Fprintf(stderr, "mkserve %s: %s\n", c.name, oneLine(err.Error()))
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "mkserve: unknown command %q (run 'mkserve help')\n", args[0])
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: mkserve <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// newFlags makes a flag set whose parse errors come back as errors (Main
// prints them); -h and -help print its flags to stderr.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: mkserve %s [flags]\n\nflags:\n", name)
		fs.SetOutput(os.Stderr)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// modelFlags are shared by the commands that run a model.
type modelFlags struct {
	dir         string
	backend     string
	precision   string
	moePath     string
	weights     string
	cudaWeights string
	kvDtype     string
	ep          int
}

func (m *modelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.dir, "model", "", "Hugging Face checkpoint directory")
	fs.StringVar(&m.backend, "backend", "cpu", "compute backend: cpu or cuda")
	fs.StringVar(&m.precision, "precision", "exact", "cuda: exact or fast (see mkserve serve --help)")
	fs.StringVar(&m.moePath, "moe-path", "", "cuda: grouped or fused MoE kernels (default: $MKSERVE_MOE_PATH, else grouped)")
	fs.IntVar(&m.ep, "ep", 1, "expert-parallel ranks (emulated in process on the CPU; on cuda through the fused MoE kernel)")
	fs.StringVar(&m.weights, "cpu-weights", "auto", "cpu: how matrices are held: auto, stored or q8 (see mkserve serve --help)")
	fs.StringVar(&m.cudaWeights, "cuda-weights", "auto", "cuda: how an MXFP4 checkpoint's experts are held: auto, stored or fp4 (see mkserve serve --help)")
	fs.StringVar(&m.kvDtype, "kv-cache-dtype", "auto", "cpu: the KV cache's element type, auto (float32) or bf16")
}

func (m *modelFlags) load() (*models.Loaded, backend.Backend, error) {
	if m.dir == "" {
		return nil, nil, fmt.Errorf("--model is required")
	}
	if m.ep < 1 {
		return nil, nil, fmt.Errorf("--ep must be at least 1, got %d", m.ep)
	}
	be, err := newBackend(backendSpec{name: m.backend, ep: m.ep, precision: m.precision, moePath: m.moePath, cpuWeights: m.weights, cudaWeights: m.cudaWeights, kvDtype: m.kvDtype})
	if err != nil {
		return nil, nil, err
	}
	l, err := models.Load(m.dir, be, models.LoadOptions{})
	if err != nil {
		return nil, nil, err
	}
	if l.Config.NumExperts > 0 && m.ep > l.Config.NumExperts {
		return nil, nil, fmt.Errorf("--ep %d exceeds the model's %d experts", m.ep, l.Config.NumExperts)
	}
	return l, be, nil
}

// parseIDs reads "3,17,42".
func parseIDs(s string) ([]int32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("--ids is required (comma-separated token ids)")
	}
	var ids []int32
	for i, f := range strings.Split(s, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("--ids: element %d (%q) is not a non-negative integer", i, f)
		}
		ids = append(ids, int32(v))
	}
	return ids, nil
}

func cmdLogits(args []string, _ io.Reader, stdout io.Writer) error {
	fs := newFlags("logits")
	var mf modelFlags
	mf.register(fs)
	idStr := fs.String("ids", "", "comma-separated token ids")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ids, err := parseIDs(*idStr)
	if err != nil {
		return err
	}
	l, be, err := mf.load()
	if err != nil {
		return err
	}
	defer l.Close()
	logits, err := engine.Logits(l.Model, be, ids)
	if err != nil {
		return err
	}
	out, err := logitsJSON(logits)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

// logitsJSON writes {"logits": [[...], ...]} with each float32 in its
// shortest round-trip form.
func logitsJSON(rows [][]float32) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"logits": [`)
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('[')
		for j, x := range r {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, fmt.Errorf("logit at position %d, token %d is %v", i, j, x)
			}
			if j > 0 {
				b.WriteString(", ")
			}
			b.Write(strconv.AppendFloat(nil, float64(x), 'g', -1, 32))
		}
		b.WriteByte(']')
	}
	b.WriteString("]}\n")
	return b.Bytes(), nil
}

func cmdGenerate(args []string, _ io.Reader, stdout io.Writer) error {
	fs := newFlags("generate")
	var mf modelFlags
	mf.register(fs)
	prompt := fs.String("prompt", "", "prompt text")
	maxTokens := fs.Int("max-tokens", 32, "new tokens at most")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *maxTokens < 1 {
		return fmt.Errorf("--max-tokens must be at least 1, got %d", *maxTokens)
	}
	if *prompt == "" {
		return fmt.Errorf("--prompt is required")
	}
	l, be, err := mf.load()
	if err != nil {
		return err
	}
	defer l.Close()
	tok, err := tokenizer.LoadDir(mf.dir)
	if err != nil {
		return err
	}
	ids, err := tok.Encode(*prompt, true)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("--prompt encodes to no tokens")
	}
	gen, err := engine.Greedy(context.Background(), l.Model, be, ids, engine.GreedyOptions{
		MaxTokens: *maxTokens, StopIDs: stopIDs(l),
	})
	if err != nil {
		return err
	}
	text, err := tok.Decode(gen, true)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, text)
	return err
}

// stopIDs are the end-of-sequence ids from generation_config.json, else config.json.
func stopIDs(l *models.Loaded) []int32 {
	src := l.Config.EOSTokenID
	if l.Generation != nil && len(l.Generation.EOSTokenIDs) > 0 {
		src = l.Generation.EOSTokenIDs
	}
	out := make([]int32, len(src))
	for i, v := range src {
		out[i] = int32(v)
	}
	return out
}

func cmdTokenize(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := newFlags("tokenize")
	file := fs.String("tokenizer", "", "tokenizer.json file")
	dir := fs.String("model", "", "model directory holding tokenizer.json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var (
		tok *tokenizer.Tokenizer
		err error
	)
	switch {
	case *file != "" && *dir != "":
		return fmt.Errorf("give --tokenizer or --model, not both")
	case *file != "":
		tok, err = tokenizer.Load(*file)
	case *dir != "":
		tok, err = tokenizer.LoadDir(*dir)
	default:
		return fmt.Errorf("--tokenizer FILE or --model DIR is required")
	}
	if err != nil {
		return err
	}
	text, err := io.ReadAll(stdin)
	if err != nil {
		return fmt.Errorf("reading stdin: %w", err)
	}
	if !utf8.Valid(text) {
		return fmt.Errorf("stdin is not valid UTF-8")
	}
	ids, err := tok.Encode(string(text), false)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	b.WriteString(`{"ids": [`)
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(int(id)))
	}
	b.WriteString("]}\n")
	_, err = stdout.Write(b.Bytes())
	return err
}
