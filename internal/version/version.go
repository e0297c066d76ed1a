// Package version describes the running binary from its build
// information: the module version, the VCS revision and time it was built
// from (with "+dirty" for uncommitted changes) and the Go version.
package version

import (
	"runtime/debug"
	"strings"
)

// Info is what the binary knows of its build.
type Info struct {
	Version  string `json:"version"`            // the module version ("(devel)" for a local build)
	Revision string `json:"revision,omitempty"` // the VCS revision, "+dirty" appended when modified
	Time     string `json:"time,omitempty"`     // the revision's commit time (RFC 3339)
	Go       string `json:"go,omitempty"`       // the Go version that built it
}

// Get reads the build information (empty fields where the build kept none:
// `go test` binaries, builds with -buildvcs=false).
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown"}
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, Go: bi.GoVersion}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && in.Revision != "" {
		in.Revision += "+dirty"
	}
	return in
}

// String is one line: "mkserve VERSION (REV12, TIME) GO".
func (in Info) String() string {
	var b strings.Builder
	b.WriteString("mkserve ")
	b.WriteString(in.Version)
	if in.Revision != "" {
		rev := in.Revision
		if r, dirty := strings.CutSuffix(rev, "+dirty"); len(r) > 12 {
			rev = r[:12]
			if dirty {
				rev += "+dirty"
			}
		}
		b.WriteString(" (" + rev)
		if in.Time != "" {
			b.WriteString(", " + in.Time)
		}
		b.WriteString(")")
	}
	if in.Go != "" {
		b.WriteString(" " + in.Go)
	}
	return b.String()
}
