package deploy

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line  int
	cmd   string // upper case
	args  string
	stage int // index of the FROM that starts its stage
}

func parseDockerfile(t *testing.T, data []byte) []instruction {
	t.Helper()
	var out []instruction
	var cur strings.Builder
	start, stage := 0, -1
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasPrefix(trimmed, "#") { // a comment inside a continuation
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cmd = strings.ToUpper(cmd)
		if cmd == "FROM" {
			stage++
		}
		out = append(out, instruction{start, cmd, strings.TrimSpace(args), stage})
		cur.Reset()
	}
	if cur.Len() > 0 {
		t.Fatalf("%s: unterminated continuation at line %d", dockerfile, start)
	}
	return out
}

// shellWords splits a command line as sh does for the simple cases a
// Dockerfile RUN uses here: spaces, single and double quotes. Anything that
// needs a real shell (&&, ;, |, $(...)) is refused.
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				w.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case strings.ContainsRune("&;|`<>()", r):
			t.Fatalf("%s: the go build RUN line must be one plain command; found %q", dockerfile, r)
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		t.Fatalf("%s: unterminated quote in %q", dockerfile, s)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// goBuildStep is the Dockerfile's go build command, taken apart.
type goBuildStep struct {
	env    []string // NAME=value assignments before the command, as written
	args   []string // the arguments after "go"
	output string   // the -o path
	stage  int
}

func dockerGoBuild(t *testing.T, ins []instruction) goBuildStep {
	t.Helper()
	var steps []goBuildStep
	for _, in := range ins {
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		words := shellWords(t, in.args)
		for len(words) > 0 && strings.HasPrefix(words[0], "--") { // RUN flags: --mount=...
			words = words[1:]
		}
		var s goBuildStep
		s.stage = in.stage
		for len(words) > 0 && regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`).MatchString(words[0]) {
			s.env, words = append(s.env, words[0]), words[1:]
		}
		if len(words) < 2 || words[0] != "go" || words[1] != "build" {
			t.Fatalf("%s:%d: RUN is not [NAME=value...] go build ...: %q", dockerfile, in.line, in.args)
		}
		s.args = words[1:]
		for i, a := range s.args {
			if a == "-o" && i+1 < len(s.args) {
				s.output = s.args[i+1]
			}
		}
		steps = append(steps, s)
	}
	if len(steps) != 1 {
		t.Fatalf("%s: %d RUN lines with go build, want 1", dockerfile, len(steps))
	}
	return steps[0]
}

func goTool(t *testing.T) string {
	t.Helper()
	// go test puts its own GOROOT/bin first on PATH; a test binary run by
	// hand may instead be given the toolchain through $GOROOT.
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no go command on PATH or in $GOROOT: %v", err)
	}
	return p
}

// TestImage builds the binary exactly as the Dockerfile's build step does,
// lays it out as the image does, and checks it is static, stripped and runs
// `validate` on the image's config.
func TestImage(t *testing.T) {
	t.Parallel() // the build is the slow part of this package
	ins := parseDockerfile(t, readFile(t, dockerfile))
	step := dockerGoBuild(t, ins)
	if !slices.Contains(step.env, "CGO_ENABLED=0") {
		t.Errorf("go build runs without CGO_ENABLED=0: %v", step.env)
	}
	if step.output == "" {
		t.Fatal("go build has no -o")
	}

	// The final stage: what it copies, runs and exposes.
	last := ins[len(ins)-1].stage
	var from, user, entrypoint, cmd string
	var expose, envs []string
	copies := map[string]string{} // destination -> source
	for _, in := range ins {
		if in.stage != last {
			continue
		}
		switch in.cmd {
		case "FROM":
			from = in.args
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		case "CMD":
			cmd = in.args
		case "EXPOSE":
			expose = strings.Fields(in.args)
		case "ENV":
			envs = append(envs, in.args)
		case "COPY":
			f := strings.Fields(in.args)
			copies[f[len(f)-1]] = strings.Join(f[:len(f)-1], " ")
		}
	}
	if from != "gcr.io/distroless/static-debian12:nonroot" || user != "nonroot" {
		t.Errorf("final stage FROM %q USER %q, want distroless static nonroot", from, user)
	}
	if !slices.Equal(expose, []string{"8081", "8080"}) {
		t.Errorf("EXPOSE %v, want 8081 8080 (the --grpc-addr and --http-addr defaults)", expose)
	}
	// /bin/ratelimit as envoyproxy/ratelimit's image, which Envoy Gateway
	// and Istio's sample run; /ratelimit, earlier images' path, a link to it.
	if want := "--from=build " + step.output; copies["/bin/ratelimit"] != want || entrypoint != `["/bin/ratelimit"]` {
		t.Errorf(`COPY to /bin/ratelimit from %q, ENTRYPOINT %s; want %q and ["/bin/ratelimit"]`, copies["/bin/ratelimit"], entrypoint, want)
	}
	const linkRun = "mkdir -p /out/root && ln -s /bin/ratelimit /out/root/ratelimit"
	if copies["/"] != "--from=build /out/root/" || !slices.ContainsFunc(ins, func(in instruction) bool {
		return in.cmd == "RUN" && in.stage == step.stage && in.args == linkRun
	}) {
		t.Errorf("the build stage does not RUN %q, or the final stage does not copy /out/root/ to /: %q", linkRun, copies["/"])
	}
	// No CMD: arguments would win over envoyproxy/ratelimit's RUNTIME_ROOT;
	// the image's rules are the config of last resort instead.
	const configDir = "/etc/ratelimit/config"
	if cmd != "" || !slices.Equal(envs, []string{"RATELIMIT_DEFAULT_CONFIG=" + configDir}) {
		t.Errorf("CMD %q, ENV %q; want no CMD and RATELIMIT_DEFAULT_CONFIG=%s", cmd, envs, configDir)
	}
	rulesGlob, ok := copies[configDir+"/"]
	if !ok {
		t.Fatalf("nothing is copied to %s/", configDir)
	}
	matches, err := filepath.Glob(filepath.Join(repoRoot, rulesGlob))
	if err != nil {
		t.Fatal(err)
	}
	var copied []string
	for _, m := range matches {
		copied = append(copied, filepath.Base(m))
	}
	if want := ruleFiles(t); !slices.Equal(copied, want) {
		t.Errorf("COPY %s takes %v, want every rule file of %s: %v", rulesGlob, copied, rulesDir, want)
	}

	// Build as the Dockerfile does, for this machine: GOOS and GOARCH come
	// from buildx there.
	image := t.TempDir()
	bin := filepath.Join(image, "bin", "ratelimit")
	args := slices.Clone(step.args)
	args[slices.Index(args, "-o")+1] = bin
	build := exec.Command(goTool(t), args...)
	build.Dir = repoRoot
	build.Env = os.Environ()
	for _, e := range step.env {
		if !strings.Contains(e, "$") {
			build.Env = append(build.Env, e)
		}
	}
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	t.Run("static", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("program header %v: the binary is dynamically linked", p.Type)
			}
		}
		if f.Section(".dynamic") != nil || f.Section(".interp") != nil {
			t.Error("the binary has .dynamic or .interp sections")
		}
		if _, err := f.Symbols(); !errors.Is(err, elf.ErrNoSymbols) {
			t.Errorf("symbol table present (want -s): %v", err)
		}
		for _, s := range f.Sections {
			if strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_") {
				t.Errorf("section %s: DWARF present (want -w)", s.Name)
			}
		}
	})

	t.Run("build settings", func(t *testing.T) {
		bi, err := buildinfo.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		// -ldflags is not recorded under -trimpath: "static" checks -s -w.
		for k, v := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true"} {
			if settings[k] != v {
				t.Errorf("build setting %s = %q, want %q", k, settings[k], v)
			}
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if root, _ := filepath.Abs(repoRoot); bytes.Contains(data, []byte(root+"/")) {
			t.Errorf("the binary contains the path %s (want -trimpath)", root)
		}
	})

	t.Run("validate the image's config", func(t *testing.T) {
		dir := filepath.Join(image, filepath.FromSlash(configDir))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, m := range matches {
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(m)), readFile(t, m), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// As the image runs it: through either path, the config from the
		// image's environment.
		old := filepath.Join(image, "ratelimit")
		if err := os.Symlink(filepath.Join("bin", "ratelimit"), old); err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{bin, old} {
			validate := exec.Command(path, "validate")
			validate.Env = []string{"RATELIMIT_DEFAULT_CONFIG=" + dir}
			out, err := validate.CombinedOutput()
			if err != nil || !strings.Contains(string(out), ": ok") {
				t.Fatalf("RATELIMIT_DEFAULT_CONFIG=%s %s validate: %v\n%s", dir, path, err, out)
			}
		}
		// And it refuses a broken one, so "ok" means something.
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		broken := "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
		if err := os.WriteFile(bad, []byte(broken), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "validate", "--config", bad).CombinedOutput(); err == nil {
			t.Errorf("validate accepted an unknown unit:\n%s", out)
		}
	})
}

// ---------------------------------------------------------------------------
// .dockerignore

// ignorePattern is one line of .dockerignore.
type ignorePattern struct {
	re     *regexp.Regexp
	negate bool
	text   string
}

// parseDockerignore follows Docker's rules: one pattern per line, # comments,
// ! for exceptions, paths cleaned and relative to the context root, * and ?
// within one path element, ** across any number of them.
func parseDockerignore(t *testing.T, data []byte) []ignorePattern {
	t.Helper()
	var ps []ignorePattern
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p := ignorePattern{text: line}
		if rest, ok := strings.CutPrefix(line, "!"); ok {
			p.negate, line = true, strings.TrimSpace(rest)
		}
		line = strings.TrimPrefix(path.Clean(line), "/")
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(line); i++ {
			switch c := line[i]; {
			case strings.HasPrefix(line[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(line[i:], "**"):
				re.WriteString(".*")
				i++
			case c == '*':
				re.WriteString("[^/]*")
			case c == '?':
				re.WriteString("[^/]")
			case c == '[' || c == '\\':
				t.Fatalf("%s: %q: character classes and escapes are not modelled here", dockerignore, p.text)
			default:
				re.WriteString(regexp.QuoteMeta(string(c)))
			}
		}
		re.WriteString("$")
		p.re = regexp.MustCompile(re.String())
		ps = append(ps, p)
	}
	return ps
}

// ignored reports whether Docker leaves file (slash-separated, relative to
// the context) out: the last pattern matching it or one of its parent
// directories decides.
func ignored(ps []ignorePattern, file string) bool {
	var prefixes []string
	for p := file; p != "."; p = path.Dir(p) {
		prefixes = append(prefixes, p)
	}
	excluded := false
	for _, p := range ps {
		if slices.ContainsFunc(prefixes, p.re.MatchString) {
			excluded = !p.negate
		}
	}
	return excluded
}

func TestDockerignore(t *testing.T) {
	ps := parseDockerignore(t, readFile(t, dockerignore))

	// Every file the build reads: the module files, the Go and embedded
	// files of every package of this module that the binary links, and the
	// rules the image copies.
	need := []string{"go.mod", "go.sum"}
	for _, f := range ruleFiles(t) {
		need = append(need, path.Join("deploy", rulesDir, f))
	}
	list := exec.Command(goTool(t), "list", "-deps", "-f",
		`{{if and .Module .Module.Main}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}`,
		"./cmd/ratelimit")
	list.Dir = repoRoot
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	embedded := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		rel, err := filepath.Rel(root, fields[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields[1:] {
			need = append(need, filepath.ToSlash(filepath.Join(rel, f)))
			if strings.HasSuffix(f, ".lua") {
				embedded++
			}
		}
	}
	if embedded == 0 {
		t.Fatal("go list found no embedded Lua scripts: the listing is wrong")
	}
	for _, f := range need {
		if ignored(ps, f) {
			t.Errorf("%s leaves out %s, which the image build needs", dockerignore, f)
		}
	}

	// And it does keep out what the build does not need.
	for _, f := range []string{".git/HEAD", "bin/ratelimit", "e2e/e2e_test.go", "internal/config/testdata/valid/envoy.yaml",
		"internal/config/config_test.go", "deploy/envoy.yaml", "deploy/k8s/sidecar/deployment.yaml", "deploy/deploy_test.go",
		"README.md", "docs/deploy.md"} {
		if !ignored(ps, f) {
			t.Errorf("%s lets %s into the build context", dockerignore, f)
		}
	}
}
