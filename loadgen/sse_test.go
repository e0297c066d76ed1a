package loadgen

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func readAll(t testing.TB, in string) ([]string, error) {
	t.Helper()
	s := newSSEReader(strings.NewReader(in))
	var out []string
	for range len(in) + 1 { // each event consumes at least one byte
		d, err := s.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, string(d))
	}
	t.Fatalf("reader did not reach EOF on %q", in)
	return nil, nil
}

func TestSSEReader(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"openai", "data: {\"a\":1}\n\ndata: [DONE]\n\n", []string{`{"a":1}`, "[DONE]"}},
		{"no space", "data:x\n\n", []string{"x"}},
		{"two spaces keep one", "data:  x\n\n", []string{" x"}},
		{"multi-line", "data: a\ndata: b\n\n", []string{"a\nb"}},
		{"crlf", "data: a\r\n\r\ndata: b\r\n\r\n", []string{"a", "b"}},
		{"cr", "data: a\r\rdata: b\r\r", []string{"a", "b"}},
		{"comments and fields", ": ping\nevent: message\nid: 3\nretry: 10\ndata: a\n\n", []string{"a"}},
		{"no data", "event: x\n\n: c\n\n", nil},
		{"unterminated", "data: tail", []string{"tail"}},
		{"unterminated blank", "data: tail\n", []string{"tail"}},
		{"empty data", "data\n\ndata:\n\n", []string{"", ""}},
		{"field without colon", "datax\ndata: y\n\n", []string{"y"}},
		{"blank lines", "\n\n\ndata: a\n\n\n\n", []string{"a"}},
		{"empty", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(t, tc.in)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("events %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestSSELineTooLong(t *testing.T) {
	in := "data: " + strings.Repeat("x", maxLine+10) + "\n\n"
	_, err := readAll(t, in)
	if !errors.Is(err, errLineTooLong) {
		t.Fatalf("err %v, want errLineTooLong", err)
	}
}

// TestSSERandomRoundTrip encodes random events with random line ends and
// checks they come back.
func TestSSERandomRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	for range 200 {
		want, in := randomStream(r)
		got, err := readAll(t, in)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("in %q: got %q, %v; want %q", in, got, err, want)
		}
	}
}

func randomStream(r *rand.Rand) (events []string, stream string) {
	ends := []string{"\n", "\r\n", "\r"}
	var b strings.Builder
	n := r.IntN(6)
	for range n {
		eol := ends[r.IntN(len(ends))]
		if r.IntN(3) == 0 {
			b.WriteString(": comment" + eol)
		}
		lines := 1 + r.IntN(3)
		var ev []string
		for range lines {
			v := randText(r)
			ev = append(ev, v)
			b.WriteString("data: " + v + eol)
		}
		b.WriteString(eol)
		events = append(events, strings.Join(ev, "\n"))
	}
	return events, b.String()
}

func randText(r *rand.Rand) string {
	const alphabet = `abc {}":,[]DONE é🙂`
	rs := []rune(alphabet)
	n := r.IntN(20)
	out := make([]rune, n)
	for i := range out {
		out[i] = rs[r.IntN(len(rs))]
	}
	return string(out)
}

// FuzzSSEReader: any byte stream ends in EOF or an error without panicking,
// and no event holds a line break other than the "\n" joining data lines.
func FuzzSSEReader(f *testing.F) {
	for _, s := range []string{"data: a\n\n", "data: a\r\ndata: b\r\n\r\n", ": x\n", "data", "\r\r\r", "data:\rdata:\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s := newSSEReader(bytes.NewReader(in))
		for range len(in) + 1 {
			d, err := s.Next()
			if err != nil {
				return
			}
			if bytes.IndexByte(d, '\r') >= 0 {
				t.Fatalf("event %q holds a CR", d)
			}
		}
		t.Fatalf("no EOF after %d events on %d bytes", len(in)+1, len(in))
	})
}

func BenchmarkSSEReader(b *testing.B) {
	var sb strings.Builder
	for i := range 1000 {
		sb.WriteString(`data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"w` + string(rune('a'+i%26)) + ` ","finish_reason":null}]}` + "\n\n")
	}
	in := sb.String()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		s := newSSEReader(strings.NewReader(in))
		for {
			if _, err := s.Next(); err != nil {
				break
			}
		}
	}
}
