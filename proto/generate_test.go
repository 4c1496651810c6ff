// Package proto holds the .proto files of the service's own APIs; the Go
// code generated from them sits next to each file. This test keeps the
// committed code in step with the .proto files and the pinned generators.
package proto

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestGeneratedCodeIsCurrent runs generate.sh, as `make proto` does, into a
// temporary directory and compares with the committed files byte for byte.
// Missing or other-version generators fail the test: the generated files
// record the versions, so another version would generate other bytes.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	// The generator reads these in a subprocess; reading them here too makes
	// them part of go test's cache key, so a changed input reruns the test.
	for _, pattern := range []string{"generate.sh", "../.ci/tools.sh", "../go.mod"} {
		if _, err := os.ReadFile(pattern); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range files(t, ".", ".proto") {
		if _, err := os.ReadFile(name); err != nil {
			t.Fatal(err)
		}
	}

	out := t.TempDir()
	cmd := exec.Command("bash", "generate.sh", out)
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("proto/generate.sh: %v\n%s\nInstall the code generators at the pinned versions with .ci/tools.sh "+
			"(protoc from apt, the plugins into GOBIN), then run make proto.", err, output)
	}

	generated := files(t, out, ".pb.go")
	if len(generated) == 0 {
		t.Fatal("proto/generate.sh generated no Go files")
	}
	for _, name := range generated {
		want, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		switch {
		case err != nil:
			t.Errorf("proto/%s is missing: run make proto and commit it", name)
		case !bytes.Equal(got, want):
			t.Errorf("proto/%s is not what make proto generates (first difference at line %d): "+
				"run make proto, or .ci/tools.sh first if the versions in its header differ", name, firstDiffLine(got, want))
		}
	}
	for _, name := range files(t, ".", ".pb.go") {
		if !slices.Contains(generated, name) {
			t.Errorf("proto/%s is generated code from no .proto file: delete it", name)
		}
	}
}

// files lists the files under dir whose names end in suffix, relative to
// dir.
func files(t *testing.T, dir, suffix string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, suffix) {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		names = append(names, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func firstDiffLine(a, b []byte) int {
	la, lb := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := range min(len(la), len(lb)) {
		if !bytes.Equal(la[i], lb[i]) {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}
