package settings

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEnvironmentFillsUnsetFlags(t *testing.T) {
	t.Setenv("RATELIMIT_REDIS_URL", "redis://env:6379")
	t.Setenv("RATELIMIT_STORE_TIMEOUT", "40ms")
	t.Setenv("RATELIMIT_GRPC_ADDR", ":9999")
	var s Settings
	fs := NewFlagSet("test", &s, &bytes.Buffer{})
	if err := Parse(fs, &s, []string{"--grpc-addr", ":7777"}); err != nil {
		t.Fatal(err)
	}
	if s.RedisURL != "redis://env:6379" || s.StoreTimeout != 40*time.Millisecond {
		t.Fatalf("environment not applied: %+v", s)
	}
	if s.GRPCAddr != ":7777" {
		t.Fatalf("grpc addr %q: the command line must win over the environment", s.GRPCAddr)
	}
}

func TestBadEnvironmentValueIsAnError(t *testing.T) {
	t.Setenv("RATELIMIT_STORE_TIMEOUT", "soon")
	var s Settings
	err := Parse(NewFlagSet("test", &s, &bytes.Buffer{}), &s, nil)
	if err == nil || !strings.Contains(err.Error(), "RATELIMIT_STORE_TIMEOUT") {
		t.Fatalf("error %v, want one naming RATELIMIT_STORE_TIMEOUT", err)
	}
}

// TestFlagsDoc: docs/flags.md's flag table has a row for every flag, with
// its default.
func TestFlagsDoc(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "flags.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "| flag | default | what it does |\n| --- | --- | --- |\n")
	if !ok {
		t.Fatal("docs/flags.md has no flag table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	table, _, _ = strings.Cut(table, "\n<!--")
	defaults := map[string]string{} // flag name: default column
	for _, row := range strings.Split(table, "\n") {
		cols := strings.Split(row, " | ")
		if len(cols) < 3 {
			t.Fatalf("docs/flags.md: flag table row %q", row)
		}
		for _, name := range strings.Split(strings.TrimPrefix(cols[0], "| "), ", ") {
			defaults[strings.Trim(name, "`-")] = strings.Trim(cols[1], "`")
		}
	}
	var s Settings
	NewFlagSet("test", &s, &bytes.Buffer{}).VisitAll(func(f *flag.Flag) {
		got, ok := defaults[f.Name]
		switch {
		case !ok:
			t.Errorf("--%s has no row in docs/flags.md's flag table", f.Name)
		case f.DefValue == "" && (got == "(empty)" || got == "(required)"):
		case got != f.DefValue:
			t.Errorf("--%s: docs/flags.md's default %q, the flag's %q", f.Name, got, f.DefValue)
		}
		delete(defaults, f.Name)
	})
	for name := range defaults {
		t.Errorf("docs/flags.md's flag table has --%s, which is no flag", name)
	}
}

// TestHelpIsOneShortLine: --help gives each flag one line; the details
// are docs/flags.md's.
func TestHelpIsOneShortLine(t *testing.T) {
	for _, e := range Table() {
		if strings.Contains(e.Help, "\n") || len(e.Help) > 110 || e.Help == "" {
			t.Errorf("--%s: help of %d characters: %q", e.Name, len(e.Help), e.Help)
		}
		if strings.Contains(e.Help, "`") {
			t.Errorf("--%s: a backquote in the help names the flag's value in --help", e.Name)
		}
	}
}

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		str  string
	}{
		{"0", 0, "0"},
		{"200MiB", 200 << 20, "200MiB"},
		{"1GiB", 1 << 30, "1GiB"},
		{"1024KiB", 1 << 20, "1MiB"},
		{"1500B", 1500, "1500B"},
		{"1500", 1500, "1500B"},
		{"2TiB", 2 << 40, "2TiB"},
	} {
		var b ByteSize
		if err := b.Set(tc.in); err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if int64(b) != tc.want || b.String() != tc.str {
			t.Errorf("%q: %d %q, want %d %q", tc.in, int64(b), b.String(), tc.want, tc.str)
		}
	}
	for _, bad := range []string{"", "MiB", "-1MiB", "200MB", "1.5GiB", "200 MiB", "9999999TiB"} {
		var b ByteSize
		if err := b.Set(bad); err == nil {
			t.Errorf("%q: accepted as %d", bad, int64(b))
		}
	}
}

func TestKeyValues(t *testing.T) {
	for _, tc := range []struct {
		in, sep string
		want    map[string]string
	}{
		{"", "=", map[string]string{}},
		{"a=1", "=", map[string]string{"a": "1"}},
		{"a=1, b = x=y ,c=", "=", map[string]string{"a": "1", "b": "x=y", "c": ""}},
		{"authorization:Bearer t:k", ":", map[string]string{"authorization": "Bearer t:k"}},
	} {
		got, err := keyValues("--f", tc.in, tc.sep)
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%q: %v, %v", tc.in, got, err)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%q: %q = %q, want %q", tc.in, k, got[k], v)
			}
		}
	}
}

// TestGRPCServerFlag: --grpc-server is lean by default, takes grpc-go from
// the command line or RATELIMIT_GRPC_SERVER, the command line winning, and
// refuses anything else, naming the two choices.
func TestGRPCServerFlag(t *testing.T) {
	parsed := func(args ...string) (string, error) {
		var s Settings
		err := Parse(NewFlagSet("test", &s, &bytes.Buffer{}), &s, args)
		return s.GRPCServer, err
	}
	if got, err := parsed(); err != nil || got != GRPCServerLean {
		t.Fatalf("default: %q %v, want lean", got, err)
	}
	if got, err := parsed("--grpc-server", "grpc-go"); err != nil || got != GRPCServerGRPCGo {
		t.Fatalf("--grpc-server grpc-go: %q %v", got, err)
	}
	t.Setenv("RATELIMIT_GRPC_SERVER", "grpc-go")
	if got, err := parsed(); err != nil || got != GRPCServerGRPCGo {
		t.Fatalf("RATELIMIT_GRPC_SERVER=grpc-go: %q %v", got, err)
	}
	if got, err := parsed("--grpc-server=lean"); err != nil || got != GRPCServerLean {
		t.Fatalf("--grpc-server=lean over RATELIMIT_GRPC_SERVER=grpc-go: %q %v, want the command line to win", got, err)
	}
	for _, bad := range []struct{ env, arg string }{{"grpc-go", "netty"}, {"Lean", ""}, {"", ""}} {
		t.Setenv("RATELIMIT_GRPC_SERVER", bad.env)
		var args []string
		if bad.arg != "" {
			args = []string{"--grpc-server", bad.arg}
		}
		_, err := parsed(args...)
		if err == nil || !strings.Contains(err.Error(), "--grpc-server") || !strings.Contains(err.Error(), "lean or grpc-go") {
			t.Errorf("RATELIMIT_GRPC_SERVER=%q %q: error %v, want one naming --grpc-server and lean or grpc-go", bad.env, args, err)
		}
	}
}

// TestTracingSettingsRefused: with --tracing, an unknown exporter protocol
// or a sampling rate out of 0 to 1 is refused.
func TestTracingSettingsRefused(t *testing.T) {
	for _, tr := range []Tracing{
		{Enabled: true, ExporterProtocol: "udp", SamplingRate: 1},
		{Enabled: true, ExporterProtocol: "http", SamplingRate: 2},
	} {
		var s Settings
		if err := Parse(NewFlagSet("test", &s, &bytes.Buffer{}), &s, nil); err != nil {
			t.Fatal(err)
		}
		s.Tracing = tr
		if err := Validate(&s); err == nil {
			t.Errorf("%+v accepted", tr)
		}
	}
}

// TestPerSecondRedisFlags: the per-second Redis is one URL, needs a main
// Redis, takes host:port as --redis-url does, and a rediss:// one is
// enough for the shared --redis-tls-* files.
func TestPerSecondRedisFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string // "": parses
	}{
		{[]string{"--redis-url=r:1", "--redis-persecond-url=p:1"}, ""},
		{[]string{"--redis-persecond-url=p:1"}, "no Redis URL"},
		{[]string{"--redis-url=r:1", "--redis-persecond-url=p:1", "--redis-persecond-cluster-url=redis://a:1"}, "give one of"},
		{[]string{"--redis-url=r:1", "--redis-persecond-url=rediss://p:1", "--redis-tls-ca=/ca.pem"}, ""},
		{[]string{"--redis-url=r:1", "--redis-persecond-url=p:1", "--redis-tls-ca=/ca.pem"}, "need a rediss://"},
		{[]string{"--redis-url=r:1", "--redis-persecond-url=u:hunter22@p:1"}, "--redis-persecond-url: \"xxxxx@p:1\""},
	} {
		var s Settings
		err := Parse(NewFlagSet("test", &s, &bytes.Buffer{}), &s, tc.args)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.err)
		}
	}
	var s Settings
	if err := Parse(NewFlagSet("test", &s, &bytes.Buffer{}), &s, []string{"--redis-url=r:1", "--redis-persecond-url=p:1"}); err != nil {
		t.Fatal(err)
	}
	if s.RedisPerSecondURL != "redis://p:1" {
		t.Errorf("--redis-persecond-url p:1 is %q, want redis://p:1", s.RedisPerSecondURL)
	}
}
