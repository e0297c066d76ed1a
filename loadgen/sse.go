package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// maxLine bounds one SSE line; a longer one is an error, not a reason to
// buffer without limit.
const maxLine = 1 << 20

// errLineTooLong is returned for a line over maxLine bytes.
var errLineTooLong = errors.New("SSE line longer than 1 MiB")

// sseReader splits a text/event-stream body into events' data, following
// the WHATWG rules a streaming OpenAI client needs: "data:" lines (one
// optional space after the colon) joined with "\n" until a blank line;
// comments (":...") and other fields (event, id, retry) ignored; LF, CRLF
// or CR line ends; an event still open at EOF is dispatched.
type sseReader struct {
	r    *bufio.Reader
	line []byte // readLine's buffer
	data []byte
	has  bool // a data field was seen in the open event
	done bool // EOF reached
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 16<<10)}
}

// Next returns the data of the next event; io.EOF once the body ends.
func (s *sseReader) Next() ([]byte, error) {
	for !s.done {
		line, err := s.readLine()
		if err == io.EOF {
			s.done = true
			if len(line) == 0 {
				break
			}
		} else if err != nil {
			return nil, err
		}
		if len(line) == 0 { // blank line: dispatch
			if s.has {
				return s.take(), nil
			}
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		if string(field) != "data" {
			continue
		}
		if s.has {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, value...)
		s.has = true
	}
	if s.has {
		return s.take(), nil
	}
	return nil, io.EOF
}

func (s *sseReader) take() []byte {
	out := s.data
	s.data, s.has = nil, false
	return out
}

// readLine returns one line without its end (LF, CRLF or CR); io.EOF with
// the last, unterminated line. The slice is valid until the next call.
func (s *sseReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		if s.r.Buffered() == 0 {
			if _, err := s.r.Peek(1); err != nil {
				if err == io.EOF {
					return s.line, io.EOF
				}
				return nil, fmt.Errorf("reading SSE stream: %w", err)
			}
		}
		buf, _ := s.r.Peek(s.r.Buffered())
		i := bytes.IndexAny(buf, "\r\n")
		if i < 0 {
			i = len(buf)
		}
		if len(s.line)+i > maxLine {
			return nil, errLineTooLong
		}
		s.line = append(s.line, buf[:i]...)
		if i == len(buf) {
			_, _ = s.r.Discard(i)
			continue
		}
		cr := buf[i] == '\r'
		_, _ = s.r.Discard(i + 1)
		if cr {
			if nb, err := s.r.Peek(1); err == nil && nb[0] == '\n' {
				_, _ = s.r.Discard(1)
			}
		}
		return s.line, nil
	}
}
