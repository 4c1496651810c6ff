package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMainRefusesBadSettings(t *testing.T) {
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
		err := Main(context.Background(), tc.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Main %q: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

func TestValidateExampleConfig(t *testing.T) {
	var out bytes.Buffer
	if err := Main(context.Background(), []string{"validate", "--config", filepath.Join("..", "..", "examples", "config")}, &out); err != nil {
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
	err := Main(context.Background(), []string{"validate", "--config", dir}, &out)
	if err == nil || !strings.Contains(err.Error(), `domain "d" already defined`) {
		t.Fatalf("without --merge-domain-config: %v", err)
	}
	if err := Main(context.Background(), []string{"validate", "--config", dir, "--merge-domain-config"}, &out); err != nil {
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
	args := []string{"validate", "--config", filepath.Join("..", "..", "examples", "config"), "--default-algorithm", "gcra"}
	if err := Main(context.Background(), args, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "5 rules in 1 files: ok") {
		t.Fatalf("output %q", out.String())
	}
}
