package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// migrationTable renders envTable as docs/migration.md's table.
func migrationTable() string {
	var b strings.Builder
	b.WriteString("| variable | reference's default | here |\n| --- | --- | --- |\n")
	for _, v := range envTable {
		def := "(none)"
		if v.def != "" {
			def = "`" + v.def + "`"
		}
		here := v.here
		switch {
		case v.flag != "" && here == "":
			here = "`--" + v.flag + "`"
		case v.flag != "" && !strings.Contains(here, "--"+v.flag):
			here = "`--" + v.flag + "`: " + here
		}
		b.WriteString("| `" + v.name + "` | " + def + " | " + code(here) + " |\n")
	}
	return b.String()
}

var (
	flagWord  = regexp.MustCompile("(^|[ (])(--[a-z][a-z0-9-]*(?:=[0-9a-z]+| unix:PATH)?)")
	upperWord = regexp.MustCompile(`\b[A-Z][A-Z0-9_]+\b`)
)

// code puts flags and the reference's variable names in backquotes.
func code(s string) string {
	if strings.Contains(s, "`") {
		return s
	}
	s = flagWord.ReplaceAllString(s, "$1`$2`")
	return upperWord.ReplaceAllStringFunc(s, func(w string) string {
		for _, v := range envTable {
			if v.name == w {
				return "`" + w + "`"
			}
		}
		return w
	})
}

// TestMigrationDoc: docs/migration.md's table is envTable's; UPDATE_DOCS=1
// rewrites it.
func TestMigrationDoc(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "migration.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- table: cmd/ratelimit/env.go -->\n", "<!-- end of table -->\n"
	before, rest, ok := bytes.Cut(doc, []byte(begin))
	_, after, ok2 := bytes.Cut(rest, []byte(end))
	if !ok || !ok2 {
		t.Fatalf("%s has no %q ... %q", path, begin, end)
	}
	want := migrationTable()
	if string(rest[:len(rest)-len(after)-len(end)]) == want {
		return
	}
	if os.Getenv("UPDATE_DOCS") != "" {
		out := append(append(append(append(before, begin...), want...), end...), after...)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%s's table differs from envTable: run UPDATE_DOCS=1 go test ./cmd/ratelimit -run TestMigrationDoc", path)
}

// TestREADMEMigration: the README's migration section names every variable
// of the reference.
func TestREADMEMigration(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Migration from envoyproxy/ratelimit\n")
	if !ok {
		t.Fatal("README has no migration section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9_]+)`").FindAllStringSubmatch(section, -1) {
		named[m[1]] = true
	}
	for _, v := range envTable {
		if !named[v.name] {
			t.Errorf("README's migration section does not name %s", v.name)
		}
	}
}
