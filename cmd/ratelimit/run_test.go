package main

import (
	"bytes"
	"context"
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
	var s settings
	fs := newFlagSet("test", &s, &bytes.Buffer{})
	if err := parse(fs, &s, []string{"--grpc-addr", ":7777"}); err != nil {
		t.Fatal(err)
	}
	if s.redisURL != "redis://env:6379" || s.storeTimeout != 40*time.Millisecond {
		t.Fatalf("environment not applied: %+v", s)
	}
	if s.grpcAddr != ":7777" {
		t.Fatalf("grpc addr %q: the command line must win over the environment", s.grpcAddr)
	}
}

func TestBadEnvironmentValueIsAnError(t *testing.T) {
	t.Setenv("RATELIMIT_STORE_TIMEOUT", "soon")
	var s settings
	err := parse(newFlagSet("test", &s, &bytes.Buffer{}), &s, nil)
	if err == nil || !strings.Contains(err.Error(), "RATELIMIT_STORE_TIMEOUT") {
		t.Fatalf("error %v, want one naming RATELIMIT_STORE_TIMEOUT", err)
	}
}

func TestRunRefusesBadSettings(t *testing.T) {
	example := filepath.Join("..", "..", "examples", "config")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"serve"}, "--config is required"},
		{[]string{"validate", "--config", example, "--default-algorithm", "token_bucket"}, "--default-algorithm"},
		{[]string{"--config", example, "--default-failure-mode", "maybe"}, "--default-failure-mode"},
		{[]string{"validate", "--config", example, "--record-costs", "sometimes"}, "--record-costs"},
		{[]string{"--config", example, "--log-level", "loud"}, "--log-level"},
		{[]string{"--config", example, "--max-request-bytes", "0"}, "--max-request-bytes"},
		{[]string{"--config", example, "--memory-limit", "200MB"}, "memory-limit"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"validate", "--config", example, "extra"}, `unexpected argument "extra"`},
	}
	for _, tc := range cases {
		err := run(context.Background(), tc.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run %q: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

func TestValidateExampleConfig(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"validate", "--config", filepath.Join("..", "..", "examples", "config")}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "5 rules in 1 files: ok") {
		t.Fatalf("output %q", out.String())
	}
}

// TestValidateMergeAndWarnings: --merge-domain-config joins two files of one
// domain, and validate prints what loads but has no effect.
func TestValidateMergeAndWarnings(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: typo}]}\n",
		"b.yaml": "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"validate", "--config", dir}, &out); err == nil || !strings.Contains(err.Error(), `domain "d" already defined`) {
		t.Fatalf("without --merge-domain-config: %v", err)
	}
	if err := run(context.Background(), []string{"validate", "--config", dir, "--merge-domain-config"}, &out); err != nil {
		t.Fatal(err)
	}
	want := "warning: " + filepath.Join(dir, "a.yaml") + `:4: replaces "typo", but no rule of domain "d" has that name` + "\n" +
		dir + ": 2 rules in 2 files: ok\n"
	if out.String() != want {
		t.Fatalf("output\n%s\nwant\n%s", out.String(), want)
	}
}

// TestValidateWithDefaultAlgorithmGCRA: --default-algorithm takes gcra, and
// the example config loads with it.
func TestValidateWithDefaultAlgorithmGCRA(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"validate", "--config", filepath.Join("..", "..", "examples", "config"), "--default-algorithm", "gcra"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "5 rules in 1 files: ok") {
		t.Fatalf("output %q", out.String())
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
	var s settings
	newFlagSet("test", &s, &bytes.Buffer{}).VisitAll(func(f *flag.Flag) {
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
