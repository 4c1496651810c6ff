package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// FileSet says which files of a config directory Load reads, and Watch
// watches. A path that is a file is read alone, whatever the set.
type FileSet uint8

// The file sets of --config-files.
const (
	// YAMLFiles, the zero value: the *.yaml and *.yml files directly in the
	// directory, dot files skipped.
	YAMLFiles FileSet = iota
	// AllFiles: every file under the directory, in subdirectories too,
	// whatever its name, dot files and dot directories included: what
	// envoyproxy/ratelimit reads (lyft/goruntime's loader) by default.
	AllFiles
	// VisibleFiles: the same, dot files and dot directories skipped: the
	// reference with RUNTIME_IGNOREDOTFILES=true.
	VisibleFiles
)

var fileSetNames = []string{YAMLFiles: "yaml", AllFiles: "all", VisibleFiles: "visible"}

// ParseFileSet returns the file set named s.
func ParseFileSet(s string) (FileSet, error) {
	if i := slices.Index(fileSetNames, s); i >= 0 {
		return FileSet(i), nil
	}
	return 0, fmt.Errorf("unknown file set %q, want one of %s", s, strings.Join(fileSetNames, ", "))
}

// String returns the name ParseFileSet accepts.
func (s FileSet) String() string {
	if int(s) >= len(fileSetNames) {
		return fmt.Sprintf("FileSet(%d)", s)
	}
	return fileSetNames[s]
}

// skipped reports a name the set leaves out wherever it is.
func (s FileSet) skipped(name string) bool {
	return s != AllFiles && strings.HasPrefix(name, ".")
}

// list returns the files Load reads for path, each directory's entries in
// name order (a subdirectory's files where its name sorts), and a warning
// for each entry left out that the reference would try and fail to read: a
// symbolic link to a directory (the reference's walk does not follow them,
// so a Kubernetes ConfigMap's "..data" is never read through it), a
// dangling link, a directory it cannot list.
func (s FileSet) list(path string) (files, warnings []string, err error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !info.IsDir() {
		return []string{path}, nil, nil
	}
	if s == YAMLFiles {
		files, err = yamlFiles(path)
	} else {
		var t *tree
		if t, err = s.walk(path); err == nil {
			files, warnings = t.files, t.warnings
		}
	}
	if err != nil {
		return nil, nil, err
	}
	if len(files) == 0 {
		// Most likely a wrong path: refuse rather than limit nothing.
		return nil, nil, fmt.Errorf("%s: %s", path, s.none())
	}
	return files, warnings, nil
}

func (s FileSet) none() string {
	switch s {
	case AllFiles:
		return "no files in it or its subdirectories"
	case VisibleFiles:
		return "no files in it or its subdirectories but dot files"
	}
	return "no *.yaml or *.yml files"
}

// yamlFiles lists YAMLFiles: symlinks are followed and dot names skipped so
// that a Kubernetes ConfigMap mount, whose "..data" entry is a symlinked
// directory, is read once.
func yamlFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if ext := filepath.Ext(name); strings.HasPrefix(name, ".") || ext != ".yaml" && ext != ".yml" {
			continue
		}
		full := filepath.Join(dir, name)
		info, err := os.Stat(full) // follows the symlink that e describes
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			files = append(files, full)
		}
	}
	return files, nil
}

// tree is what walk finds under a directory.
type tree struct {
	files, dirs, warnings []string
}

// walk lists AllFiles or VisibleFiles under root as lyft/goruntime's loader
// walks the reference's runtime directory (filepath.Walk): depth first, each
// directory's entries in name order, symbolic links to files read, links to
// directories not followed (root itself excepted: it is --config).
func (s FileSet) walk(root string) (*tree, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	t := &tree{dirs: []string{root}}
	t.add(s, root, entries)
	return t, nil
}

func (t *tree) add(s FileSet, dir string, entries []fs.DirEntry) {
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if s.skipped(e.Name()) {
			continue
		}
		if e.IsDir() {
			sub, err := os.ReadDir(path)
			if err != nil {
				t.warnings = append(t.warnings, notRead(path, err))
				continue
			}
			t.dirs = append(t.dirs, path)
			t.add(s, path, sub)
			continue
		}
		info, err := os.Stat(path) // follows a symbolic link
		switch {
		case err != nil:
			t.warnings = append(t.warnings, notRead(path, err))
		case info.IsDir():
			t.warnings = append(t.warnings, fmt.Sprintf("%s: a symbolic link to a directory: not read (nor by the reference)", path))
		case !info.Mode().IsRegular():
			t.warnings = append(t.warnings, fmt.Sprintf("%s: not a regular file: not read", path))
		default:
			t.files = append(t.files, path)
		}
	}
}

// dirs returns the directories Watch watches for path: path's own (for a
// file, the one holding it), and with AllFiles or VisibleFiles every
// directory under it the set reads, since a watch sees no deeper than the
// directory it is on.
func (s FileSet) dirs(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	switch {
	case !info.IsDir():
		return []string{filepath.Dir(path)}, nil
	case s == YAMLFiles:
		return []string{path}, nil
	}
	t, err := s.walk(path)
	if err != nil {
		return nil, err
	}
	return t.dirs, nil
}

// notRead is the warning for a file or directory left out because it
// cannot be read.
func notRead(path string, err error) string {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		err = pe.Err // its path is path
	}
	return fmt.Sprintf("%s: not read: %v", path, err)
}
