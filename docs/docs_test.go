// Package docs holds the project's documentation; its tests keep the README
// short and every relative link of the README and docs/*.md pointing at a file
// (and, for an #anchor into Markdown, a heading) that exists.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// maxReadmeBytes keeps the README a front door: what the service is, the
// two make commands, a first call, Envoy's blocks, a short config and the
// links; depth goes to docs/ (the whole Go program e2e builds is in go.md).
// The README was about 9,800 bytes when this was set.
const maxReadmeBytes = 12000

func TestReadmeSize(t *testing.T) {
	fi, err := os.Stat(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > maxReadmeBytes {
		t.Errorf("README.md is %d bytes, more than %d: move the detail to docs/", fi.Size(), maxReadmeBytes)
	}
}

// markdownFiles returns README.md and docs/*.md, as paths relative to this
// directory.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md found")
	}
	return append([]string{filepath.Join("..", "README.md")}, docs...)
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	heading    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	codeSpan   = regexp.MustCompile("`[^`\n]+`")
	inlineLink = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
)

// prose returns a Markdown file's text outside fenced code blocks, and the
// headings found there.
func prose(text string) (string, []string) {
	var b strings.Builder
	var heads []string
	in := false
	for line := range strings.Lines(text) {
		if fence.MatchString(line) {
			in = !in
			continue
		}
		if in {
			continue
		}
		if m := heading.FindStringSubmatch(strings.TrimRight(line, "\n")); m != nil {
			heads = append(heads, m[1])
		}
		b.WriteString(line)
	}
	return b.String(), heads
}

// slug is GitHub's anchor for a heading: lower case, spaces to '-', every
// other character that is not a letter, a digit, '-' or '_' dropped.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown file's headings; a repeated
// heading gets GitHub's -1, -2, ... suffixes.
func anchors(heads []string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, h := range heads {
		s := slug(h)
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func TestSlug(t *testing.T) {
	for _, c := range []struct{ heading, want string }{
		{"Migration from envoyproxy/ratelimit", "migration-from-envoyproxyratelimit"},
		{"Memory: `noeviction`", "memory-noeviction"},
		{"duration_until_reset", "duration_until_reset"},
		{"All or nothing, by store mode", "all-or-nothing-by-store-mode"},
		{"The gRPC port against hostile clients", "the-grpc-port-against-hostile-clients"},
		{"Service CPU per decision, before and after", "service-cpu-per-decision-before-and-after"},
	} {
		if got := slug(c.heading); got != c.want {
			t.Errorf("slug(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
	got := anchors([]string{"Tests", "Tests", "Tests"})
	for _, want := range []string{"tests", "tests-1", "tests-2"} {
		if !got[want] {
			t.Errorf("anchors of three headings Tests: no %q in %v", want, got)
		}
	}
}

// TestLinks: every relative link of README.md and docs/*.md names a file or
// directory that exists, and an #anchor into a Markdown file names one of its
// headings.
func TestLinks(t *testing.T) {
	headsOf := map[string]map[string]bool{}
	headings := func(path string) (map[string]bool, error) {
		path = filepath.Clean(path)
		if a, ok := headsOf[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		_, heads := prose(string(b))
		headsOf[path] = anchors(heads)
		return headsOf[path], nil
	}

	for _, file := range markdownFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			text, _ := prose(string(b))
			text = codeSpan.ReplaceAllString(text, "code")
			links := inlineLink.FindAllStringSubmatch(text, -1)
			for _, m := range links {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				if path == "" {
					path = file
				} else {
					path = filepath.Join(filepath.Dir(file), path)
				}
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: %v", file, target, err)
					continue
				}
				if anchor == "" || !strings.HasSuffix(path, ".md") {
					continue
				}
				a, err := headings(path)
				if err != nil {
					t.Errorf("%s: link %q: %v", file, target, err)
				} else if !a[anchor] {
					t.Errorf("%s: link %q: %s has no heading with that anchor", file, target, path)
				}
			}
		})
	}
}
