package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// gpt2Path is where CI keeps the real GPT-2 tokenizer.json, relative to this
// package: ../shared beside the checkout.
const gpt2Path = "../../shared/tokenizers/gpt2/tokenizer.json"

// expected is the output of scripts/gen_tokenizer_testdata.py: what HF
// tokenizers 0.23 produced for each string.
type expected struct {
	Name               string `json:"name"`
	TokenizersVersion  string `json:"tokenizers_version"`
	VocabSize          int    `json:"vocab_size"`
	VocabSizeWithAdded int    `json:"vocab_size_with_added"`
	MaxID              int    `json:"max_id"`
	AddedTokens        []struct {
		ID      int32  `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	TokenToID map[string]*int32 `json:"token_to_id"`
	Cases     []struct {
		Text              string   `json:"text"`
		IDs               []int32  `json:"ids"`
		Tokens            []string `json:"tokens"`
		IDsSpecial        []int32  `json:"ids_special"`
		Decode            string   `json:"decode"`
		DecodeSkip        string   `json:"decode_skip"`
		DecodeSpecial     string   `json:"decode_special"`
		DecodeSpecialSkip string   `json:"decode_special_skip"`
		Normalized        *string  `json:"normalized"`
		PreTokenized      []string `json:"pretokenized"`
	} `json:"cases"`
	DecodeCases []struct {
		IDs        []int32 `json:"ids"`
		Decode     string  `json:"decode"`
		DecodeSkip string  `json:"decode_skip"`
	} `json:"decode_cases"`
}

type hfCase struct {
	name     string
	tokPath  string // tokenizer.json
	dir      string // for LoadDir; "" if no tokenizer_config.json
	expected string
	missing  string // why the case cannot run here, if it cannot
}

func hfCases(t testing.TB) []hfCase {
	var cs []hfCase
	for _, n := range []string{"qwen2", "llama3", "bytefallback", "metaspace", "deepseek3", "misc", "misc2"} {
		d := filepath.Join("testdata", n)
		cs = append(cs, hfCase{name: n, tokPath: filepath.Join(d, "tokenizer.json"), dir: d, expected: filepath.Join(d, "expected.json")})
	}
	g := hfCase{name: "gpt2", tokPath: gpt2Path, expected: filepath.Join("testdata", "gpt2", "expected.json")}
	if _, err := os.Stat(gpt2Path); errors.Is(err, os.ErrNotExist) {
		g.missing = "the GPT-2 tokenizer.json is not at " + gpt2Path + " (../shared/tokenizers/gpt2 beside the checkout)"
	}
	return append(cs, g)
}

func loadExpected(t testing.TB, path string) *expected {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var e expected
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(e.Cases) < 50 {
		t.Fatalf("%s: only %d cases", path, len(e.Cases))
	}
	return &e
}

func loadCase(t testing.TB, c hfCase) *Tokenizer {
	t.Helper()
	var tok *Tokenizer
	var err error
	if c.dir != "" {
		tok, err = LoadDir(c.dir)
	} else {
		tok, err = Load(c.tokPath)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestMatchesHF(t *testing.T) {
	for _, c := range hfCases(t) {
		t.Run(c.name, func(t *testing.T) {
			if c.missing != "" {
				t.Skip(c.missing)
			}
			tok := loadCase(t, c)
			e := loadExpected(t, c.expected)
			if got := tok.VocabSize(); got != e.MaxID+1 {
				t.Errorf("VocabSize = %d, want %d", got, e.MaxID+1)
			}
			for _, a := range e.AddedTokens {
				if id, ok := tok.TokenID(a.Content); !ok || id != a.ID {
					t.Errorf("TokenID(%q) = %d, %v; want %d", a.Content, id, ok, a.ID)
				}
				if s, special, ok := tok.IDToken(a.ID); !ok || s != a.Content || special != a.Special {
					t.Errorf("IDToken(%d) = %q, %v, %v; want %q, %v", a.ID, s, special, ok, a.Content, a.Special)
				}
			}
			for s, want := range e.TokenToID {
				id, ok := tok.TokenID(s)
				if (want == nil) == ok || (want != nil && *want != id) {
					t.Errorf("TokenID(%q) = %d, %v; want %v", s, id, ok, want)
				}
			}
			fails := 0
			for i, tc := range e.Cases {
				fail := func(format string, args ...any) {
					fails++
					if fails <= 10 {
						t.Errorf("case %d %q: "+format, append([]any{i, tc.Text}, args...)...)
					}
				}
				if tc.Normalized != nil && tok.norm != nil {
					if got, err := tok.norm.normalize(tc.Text); err != nil || got != *tc.Normalized {
						fail("normalize = %q, %v; want %q", got, err, *tc.Normalized)
					}
				}
				if tc.PreTokenized != nil && tok.pre != nil {
					ps, err := tok.pre.split(piece{text: tc.Text})
					got := make([]string, len(ps))
					for i, p := range ps {
						got[i] = p.text
					}
					if err != nil || !slices.Equal(got, tc.PreTokenized) {
						fail("pre-tokenize = %q, %v; want %q", got, err, tc.PreTokenized)
					}
				}
				ids, err := tok.Encode(tc.Text, false)
				if err != nil {
					fail("Encode: %v", err)
					continue
				}
				if !slices.Equal(ids, tc.IDs) {
					fail("Encode(addSpecial=false)\n got %v\nwant %v\nwant tokens %q", ids, tc.IDs, tc.Tokens)
				}
				ids, err = tok.Encode(tc.Text, true)
				if err != nil || !slices.Equal(ids, tc.IDsSpecial) {
					fail("Encode(addSpecial=true) = %v, %v; want %v", ids, err, tc.IDsSpecial)
				}
				for _, d := range []struct {
					ids  []int32
					skip bool
					want string
				}{{tc.IDs, false, tc.Decode}, {tc.IDs, true, tc.DecodeSkip}, {tc.IDsSpecial, false, tc.DecodeSpecial}, {tc.IDsSpecial, true, tc.DecodeSpecialSkip}} {
					got, err := tok.Decode(d.ids, d.skip)
					if err != nil || got != d.want {
						fail("Decode(%v, skip=%v) = %q, %v; want %q", d.ids, d.skip, got, err, d.want)
					}
					if s := streamDecode(t, tok, d.ids, d.skip); s != d.want {
						fail("stream decode(%v, skip=%v) = %q; want %q", d.ids, d.skip, s, d.want)
					}
				}
			}
			for i, dc := range e.DecodeCases {
				for _, d := range []struct {
					skip bool
					want string
				}{{false, dc.Decode}, {true, dc.DecodeSkip}} {
					got, err := tok.Decode(dc.IDs, d.skip)
					if err != nil || got != d.want {
						fails++
						t.Errorf("decode case %d: Decode(%v, %v) = %q, %v; want %q", i, dc.IDs, d.skip, got, err, d.want)
					}
					if s := streamDecode(t, tok, dc.IDs, d.skip); s != d.want {
						fails++
						t.Errorf("decode case %d: stream(%v, %v) = %q; want %q", i, dc.IDs, d.skip, s, d.want)
					}
				}
			}
			if fails > 0 {
				t.Logf("%d failures in %s (HF tokenizers %s)", fails, c.name, e.TokenizersVersion)
			}
		})
	}
}

// streamDecode feeds ids one by one to a StreamDecoder and joins its output.
func streamDecode(t testing.TB, tok *Tokenizer, ids []int32, skip bool) string {
	t.Helper()
	d := tok.NewStreamDecoder(skip)
	var sb strings.Builder
	for _, id := range ids {
		s, err := d.Add(id)
		if err != nil {
			t.Fatalf("StreamDecoder.Add(%d): %v", id, err)
		}
		sb.WriteString(s)
	}
	sb.WriteString(d.Flush())
	return sb.String()
}

// TestSugarmePipelineMatches runs every HF case through the sugarme
// PreTokenizedString pipeline (our stages behind sugarme's interfaces) and
// checks it gives the same ids as Encode and HF.
func TestSugarmePipelineMatches(t *testing.T) {
	for _, c := range hfCases(t) {
		t.Run(c.name, func(t *testing.T) {
			if c.missing != "" {
				t.Skip(c.missing)
			}
			tok := loadCase(t, c)
			e := loadExpected(t, c.expected)
			for i, tc := range e.Cases {
				ids, err := tok.encodeWith(tc.Text, tok.encodePieceSugarme)
				if err != nil || !slices.Equal(ids, tc.IDs) {
					t.Errorf("case %d %q: sugarme pipeline = %v, %v; want %v", i, tc.Text, ids, err, tc.IDs)
				}
			}
		})
	}
}
