package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The directories of testdata/dirs (see testdata/README.md).
var (
	treeDir      = filepath.Join("testdata", "dirs", "tree")
	configMapDir = filepath.Join("testdata", "dirs", "configmap")
	configMapVer = filepath.Join(configMapDir, "..2026_11_24_07_00_00.000000001")
)

// TestLoadFileSets: which files of a directory each --config-files value
// reads, in which order, and what it says of the entries it leaves out.
func TestLoadFileSets(t *testing.T) {
	tree := func(names ...string) []string {
		var paths []string
		for _, n := range names {
			paths = append(paths, filepath.Join(treeDir, n))
		}
		return paths
	}
	linkWarning := filepath.Join(treeDir, "link-to-nested") + ": a symbolic link to a directory: not read (nor by the reference)"
	for _, tt := range []struct {
		name     string
		path     string
		files    FileSet
		merge    bool
		want     []string // files read, in order
		domains  []string
		warnings []string
		err      []string // the error must hold each
	}{
		{name: "yaml: *.yaml directly in it", path: treeDir, files: YAMLFiles,
			want: tree("a.yaml"), domains: []string{"a"}},
		{name: "all: every file, recursively, dot files and dot directories too", path: treeDir, files: AllFiles,
			want:    tree(".dotdir/d.yaml", ".hidden", "a.yaml", "nested/c.conf", "nested/deeper/b"),
			domains: []string{"a", "b", "c", "dotdir", "hidden"}, warnings: []string{linkWarning}},
		{name: "visible: dot files and dot directories skipped", path: treeDir, files: VisibleFiles,
			want: tree("a.yaml", "nested/c.conf", "nested/deeper/b"), domains: []string{"a", "b", "c"}, warnings: []string{linkWarning}},
		{name: "a file is read alone, whatever the set", path: filepath.Join(treeDir, "nested", "deeper", "b"), files: VisibleFiles,
			want: tree("nested/deeper/b"), domains: []string{"b"}},

		// A Kubernetes ConfigMap volume: config.yaml -> ..data/config.yaml,
		// ..data -> ..<timestamp>.
		{name: "ConfigMap, yaml", path: configMapDir, files: YAMLFiles,
			want: []string{filepath.Join(configMapDir, "config.yaml")}, domains: []string{"cm"}},
		{name: "ConfigMap, visible: read once, through the link", path: configMapDir, files: VisibleFiles,
			want: []string{filepath.Join(configMapDir, "config.yaml")}, domains: []string{"cm"}},
		// The reference with RUNTIME_IGNOREDOTFILES=false reads the file in
		// the timestamped directory and through the link: its domain twice.
		{name: "ConfigMap, all: the domain twice", path: configMapDir, files: AllFiles,
			err: []string{filepath.Join(configMapDir, "config.yaml") + ":1", `domain "cm" already defined in ` + filepath.Join(configMapVer, "config.yaml")}},
		{name: "ConfigMap, all, merging domains: its descriptor twice", path: configMapDir, files: AllFiles, merge: true,
			err: []string{filepath.Join(configMapDir, "config.yaml") + ":3", filepath.Join(configMapVer, "config.yaml") + ":3"}},

		// One file that is not a config fails the whole load, naming it.
		{name: "a text file, yaml: not read", path: filepath.Join("testdata", "dirs", "notyaml"), files: YAMLFiles,
			want: []string{filepath.Join("testdata", "dirs", "notyaml", "a.yaml")}, domains: []string{"a"}},
		{name: "a text file, visible: fails the load", path: filepath.Join("testdata", "dirs", "notyaml"), files: VisibleFiles,
			err: []string{filepath.Join("testdata", "dirs", "notyaml", "README") + ":1: top level must be a mapping"}},
		{name: "an empty file fails the load", path: filepath.Join("testdata", "dirs", "emptyfile"), files: AllFiles,
			err: []string{filepath.Join("testdata", "dirs", "emptyfile", "empty") + ":1: empty file"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.path, Defaults{Files: tt.files, MergeDomains: tt.merge})
			if tt.err != nil {
				for _, want := range tt.err {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Errorf("error %v, want it to hold %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Files(); !slices.Equal(got, tt.want) {
				t.Errorf("files %q, want %q", got, tt.want)
			}
			var domains []string
			for _, r := range c.Rules() {
				domains = append(domains, r.Domain)
			}
			if !slices.Equal(domains, tt.domains) {
				t.Errorf("rules of domains %q, want %q", domains, tt.domains)
			}
			if got := c.Warnings(); !slices.Equal(got, tt.warnings) {
				t.Errorf("warnings %q, want %q", got, tt.warnings)
			}
		})
	}
}

// TestLoadFileSetsLeaveOut: as the reference, what cannot be read is left
// out with a warning, unless nothing is left; an empty directory is
// refused, whatever the set.
func TestLoadFileSetsLeaveOut(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a"), "domain: a\n")
	if err := os.Symlink("gone", filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir, Defaults{Files: VisibleFiles})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "dangling") + ": not read: no such file or directory"}
	if !slices.Equal(c.Files(), []string{filepath.Join(dir, "a")}) || !slices.Equal(c.Warnings(), want) {
		t.Errorf("files %q, warnings %q; want a, and %q", c.Files(), c.Warnings(), want)
	}

	// The directory itself may be a link, as --config: it is followed.
	abs, err := filepath.Abs(treeDir)
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "mounted")
	if err := os.Symlink(abs, link); err != nil {
		t.Fatal(err)
	}
	if c, err := Load(link, Defaults{Files: VisibleFiles}); err != nil || len(c.Files()) != 3 || !strings.HasPrefix(c.Files()[0], link) {
		t.Errorf("through a link: %v, files %q; want the 3 visible ones", err, c.Files())
	}

	for _, files := range []FileSet{YAMLFiles, AllFiles, VisibleFiles} {
		empty := t.TempDir()
		if err := os.Mkdir(filepath.Join(empty, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(empty, ".only-a-dot-file"), "domain: a\n")
		_, err := Load(empty, Defaults{Files: files})
		if files == AllFiles {
			if err != nil {
				t.Errorf("all: %v, want the dot file read", err)
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), empty+": no ") {
			t.Errorf("%s: error %v, want one saying %s has no files", files, err, empty)
		}
	}
}

func TestParseFileSet(t *testing.T) {
	for s, want := range map[string]FileSet{"yaml": YAMLFiles, "all": AllFiles, "visible": VisibleFiles} {
		f, err := ParseFileSet(s)
		if err != nil || f != want || f.String() != s {
			t.Errorf("ParseFileSet(%q) = %v, %v; want %d", s, f, err, want)
		}
	}
	if _, err := ParseFileSet("YAML"); err == nil || !strings.Contains(err.Error(), "yaml, all, visible") {
		t.Errorf("ParseFileSet(YAML): %v, want an error listing the names", err)
	}
}
