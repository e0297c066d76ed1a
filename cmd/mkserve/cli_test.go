package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const goldenQwen3 = "../../models/testdata/golden/qwen3_moe"

func runCLI(args []string, stdin string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, strings.NewReader(stdin), &o, &e)
	return code, o.String(), e.String()
}

func TestLogitsCommand(t *testing.T) {
	code, out, errOut := runCLI([]string{"logits", "--model", goldenQwen3, "--ids", "3,17,42"}, "")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var v struct{ Logits [][]float32 }
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("stdout is not one JSON object: %v", err)
	}
	if len(v.Logits) != 3 || len(v.Logits[0]) < 2 {
		t.Fatalf("logits shape %dx%d", len(v.Logits), len(v.Logits[0]))
	}
	if strings.Count(out, "\n") != 1 {
		t.Errorf("want exactly one line of output")
	}
	// --ep 4 gives the same numbers up to summation order.
	code, out4, errOut := runCLI([]string{"logits", "--model", goldenQwen3, "--ids", "3,17,42", "--ep", "4"}, "")
	if code != 0 {
		t.Fatalf("--ep 4: exit %d: %s", code, errOut)
	}
	var v4 struct{ Logits [][]float32 }
	if err := json.Unmarshal([]byte(out4), &v4); err != nil {
		t.Fatal(err)
	}
	for i := range v.Logits {
		for j := range v.Logits[i] {
			if d := v.Logits[i][j] - v4.Logits[i][j]; d > 1e-4 || d < -1e-4 {
				t.Fatalf("ep 4 logit [%d][%d] = %v, ep 1 %v", i, j, v4.Logits[i][j], v.Logits[i][j])
			}
		}
	}
}

func TestCommandErrorsAreOneLine(t *testing.T) {
	empty := t.TempDir()
	badTok := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(badTok, []byte(`{"model": 3`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"logits", "--model", empty, "--ids", "1"}, "config.json"},
		{[]string{"logits", "--model", goldenQwen3, "--ids", "1,x"}, "--ids"},
		{[]string{"logits", "--model", goldenQwen3, "--ids", "1,-4"}, "--ids"},
		{[]string{"logits", "--model", goldenQwen3, "--ids", "1,99999"}, "vocabulary"},
		{[]string{"logits", "--model", goldenQwen3}, "--ids"},
		{[]string{"logits", "--ids", "1"}, "--model"},
		{[]string{"logits", "--model", goldenQwen3, "--ids", "1", "--backend", "tpu"}, "tpu"},
		{[]string{"logits", "--model", goldenQwen3, "--ids", "1", "--backend", "cuda"}, "backend cuda"},
		{[]string{"logits", "--model", goldenQwen3, "--ids", "1", "--ep", "0"}, "--ep"},
		{[]string{"generate", "--model", empty, "--prompt", "hi"}, "config.json"},
		{[]string{"generate", "--model", goldenQwen3}, "--prompt"},
		{[]string{"tokenize", "--tokenizer", badTok}, "tokenizer.json"},
		{[]string{"tokenize"}, "--tokenizer"},
		{[]string{"frobnicate"}, "frobnicate"},
		{[]string{"version", "extra"}, "no arguments"},
		{[]string{"logits", "--nope"}, "nope"},
	} {
		code, out, errOut := runCLI(tc.args, "text")
		if code == 0 {
			t.Errorf("%v: exit 0", tc.args)
			continue
		}
		if out != "" {
			t.Errorf("%v: wrote %q to stdout on failure", tc.args, out)
		}
		if strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: stderr %q, want one line mentioning %q", tc.args, errOut, tc.want)
		}
	}
}

// TestVersion: `mkserve version` prints one line naming the build's Go
// version (the test binary's build information).
func TestVersion(t *testing.T) {
	code, out, errOut := runCLI([]string{"version"}, "")
	if code != 0 || !strings.HasPrefix(out, "mkserve ") || !strings.Contains(out, runtime.Version()) || strings.Count(out, "\n") != 1 {
		t.Errorf("version: exit %d, %q (stderr %q)", code, out, errOut)
	}
}

func TestGenerateAndTokenize(t *testing.T) {
	code, out, errOut := runCLI([]string{"generate", "--model", goldenQwen3, "--prompt", "Hello there", "--max-tokens", "6"}, "")
	if code != 0 {
		t.Fatalf("generate: exit %d: %s", code, errOut)
	}
	if !strings.HasSuffix(out, "\n") {
		t.Errorf("generate output %q does not end in a newline", out)
	}
	code, out, errOut = runCLI([]string{"tokenize", "--model", goldenQwen3}, "Hello there")
	if code != 0 {
		t.Fatalf("tokenize: exit %d: %s", code, errOut)
	}
	var v struct{ IDs []int }
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v.IDs) == 0 {
		t.Fatalf("tokenize output %q: %v", out, err)
	}
}
