package settings

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// migrationTable renders the reference's variables (the table's, then
// noEffect) as docs/migration.md's table.
func migrationTable() string {
	var b strings.Builder
	b.WriteString("| variable | reference's default | here |\n| --- | --- | --- |\n")
	for _, v := range allVars() {
		def := "(none)"
		if v.Default != "" {
			def = "`" + v.Default + "`"
		}
		here := v.Here
		switch {
		case v.flag != "" && here == "":
			here = "`--" + v.flag + "`"
		case v.flag != "" && !strings.Contains(here, "--"+v.flag):
			here = "`--" + v.flag + "`: " + here
		}
		b.WriteString("| `" + v.Name + "` | " + def + " | " + code(here) + " |\n")
	}
	return b.String()
}

// flagsTable renders the table as docs/flags.md's table.
func flagsTable() string {
	var b strings.Builder
	b.WriteString("| flag | default | what it does |\n| --- | --- | --- |\n")
	var s Settings
	fs := NewFlagSet("doc", &s, &bytes.Buffer{})
	for _, e := range table(&s) {
		def := e.DocDefault
		if f := fs.Lookup(e.Name); def == "" && f.DefValue == "" {
			def = "(empty)"
		} else if def == "" {
			def = "`" + f.DefValue + "`"
		}
		doc := e.Doc
		if doc == "" {
			doc = e.Help
		}
		b.WriteString("| `--" + e.Name + "` | " + def + " | " + doc + " |\n")
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
		for _, v := range allVars() {
			if v.Name == w {
				return "`" + w + "`"
			}
		}
		return w
	})
}

// checkGenerated fails t when the part of the document at path between
// begin and end differs from want; UPDATE_DOCS=1 rewrites it.
func checkGenerated(t *testing.T, path, begin, end, want string) {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := bytes.Cut(doc, []byte(begin))
	_, after, ok2 := bytes.Cut(rest, []byte(end))
	if !ok || !ok2 {
		t.Fatalf("%s has no %q ... %q", path, begin, end)
	}
	if string(rest[:len(rest)-len(after)-len(end)]) == want {
		return
	}
	if os.Getenv("UPDATE_DOCS") != "" {
		// A new slice: before shares doc's array with after, which appending
		// to before would overwrite.
		out := slices.Concat(before, []byte(begin), []byte(want), []byte(end), after)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%s's table differs from the settings table: run UPDATE_DOCS=1 go test ./internal/settings -run 'Test(Migration|Flags)Doc'", path)
}

// TestMigrationDoc: docs/migration.md's table is the reference's variables
// of the settings table and noEffect; UPDATE_DOCS=1 rewrites it.
func TestMigrationDoc(t *testing.T) {
	checkGenerated(t, filepath.Join("..", "..", "docs", "migration.md"),
		"<!-- table: internal/settings (table.go, noeffect.go) -->\n", "<!-- end of table -->\n", migrationTable())
}

// TestFlagsDocTable: docs/flags.md's table is the settings table's;
// UPDATE_DOCS=1 rewrites it.
func TestFlagsDocTable(t *testing.T) {
	checkGenerated(t, filepath.Join("..", "..", "docs", "flags.md"),
		"<!-- table: internal/settings/table.go -->\n", "<!-- end of table -->\n", flagsTable())
}

// TestMigrationGuide: the README's migration section sends the reader to
// docs/migration.md, which names every variable of the reference (the README
// named them all itself before it was cut to a front door).
func TestMigrationGuide(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Migration from envoyproxy/ratelimit\n")
	if !ok {
		t.Fatal("README has no migration section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	if !strings.Contains(section, "(docs/migration.md") {
		t.Error("README's migration section does not link docs/migration.md")
	}
	guide, err := os.ReadFile(filepath.Join("..", "..", "docs", "migration.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9_]+)`").FindAllStringSubmatch(string(guide), -1) {
		named[m[1]] = true
	}
	for _, v := range allVars() {
		if !named[v.Name] {
			t.Errorf("docs/migration.md does not name %s", v.Name)
		}
	}
}
