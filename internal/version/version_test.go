package version

import (
	"runtime/debug"
	"testing"
)

// TestFromBuildInfo: the module version, revision (shortened, dirty
// marked) and time come from the build settings; a build without them
// still names its Go version.
func TestFromBuildInfo(t *testing.T) {
	for _, c := range []struct {
		name     string
		bi       debug.BuildInfo
		want     Info
		wantLine string
	}{
		{"a clean checkout", debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-12-01T00:00:00Z"}, {Key: "vcs.modified", Value: "false"}}},
			Info{Version: "(devel)", Revision: "0123456789abcdef0123", Time: "2026-12-01T00:00:00Z", Go: "go1.26.0"},
			"mkserve (devel) (0123456789ab, 2026-12-01T00:00:00Z) go1.26.0"},
		{"uncommitted changes", debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abcdef0123456789"}, {Key: "vcs.modified", Value: "true"}}},
			Info{Version: "v1.2.3", Revision: "abcdef0123456789+dirty", Go: "go1.26.0"},
			"mkserve v1.2.3 (abcdef012345+dirty) go1.26.0"},
		{"no VCS settings", debug.BuildInfo{GoVersion: "go1.26.0"}, Info{Version: "(devel)", Go: "go1.26.0"}, "mkserve (devel) go1.26.0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := fromBuildInfo(&c.bi)
			if got != c.want || got.String() != c.wantLine {
				t.Errorf("%+v %q, want %+v %q", got, got.String(), c.want, c.wantLine)
			}
		})
	}
	if in := Get(); in.Go == "" || in.Version == "" {
		t.Errorf("this test binary's build: %+v", in)
	}
}
