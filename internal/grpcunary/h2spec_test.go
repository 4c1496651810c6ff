package grpcunary

// HTTP/2 conformance: h2spec (github.com/summerwind/h2spec, a separate
// binary that .ci/tools.sh installs into GOBIN) against this package's
// server, which must pass every case, and against grpc-go's server, which
// must fail exactly the cases it is known to fail (grpcGoKnown): a case
// that starts failing or starts passing there fails the test, so the list
// stays true. Six of grpc-go's cases pass or fail by timing (see timing).

import (
	"bytes"
	"debug/buildinfo"
	"encoding/xml"
	"errors"
	"fmt"
	"go/build"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// h2specCaseCount is the number of cases h2spec runs without --strict, at
// the version .ci/tools.sh pins: a check that the case list was parsed.
const h2specCaseCount = 145

// h2specTimeout is h2spec's -o, in seconds: how long a case waits for the
// server's answer. Generous, for the race detector on a busy machine. A
// case that fails by timeout takes that long: grpc-go's known failures run
// each in its own h2spec process, all at once.
const h2specTimeout = 10

// h2specPath is the test's request path: a unary method of TestService.
const h2specPath = "/grpc.testing.TestService/UnaryCall"

// outcome of an h2spec case.
type outcome string

const (
	passed  outcome = "passed"
	failed  outcome = "failed"
	skipped outcome = "skipped" // h2spec found nothing to test (ErrSkipped)
)

// knownCase is a case grpc-go's server does not pass, and why.
type knownCase struct {
	want   outcome // or timing: failed or passed
	reason string
}

// timing marks a case whose outcome on grpc-go's server depends on timing,
// accepted failed or passed.
const timing outcome = "failed or passed, by timing"

// grpcGoKnown are the h2spec cases grpc-go's server (grpc.NewServer(), at
// the version in go.mod) does not pass; every other case passes. Ids are
// h2spec's: `h2spec <id>` runs that case alone, `h2spec --dryrun` lists
// them. h2spec's request is a GET without a gRPC content-type, which
// grpc-go answers at once with a trailers-only HTTP 415.
var grpcGoKnown = map[string]knownCase{
	"generic/2/2": {failed, "grpc-go's server does not answer with DATA (trailers-only 415), which the case waits for"},
	"generic/2/3": {failed, "grpc-go's server does not answer with DATA (trailers-only 415), which the case waits for"},

	"http2/3.5/2": {failed, "grpc-go's server does not read the rest of an invalid preface before it closes: the client sees a reset, not a close"},

	"http2/5.1/1":  {failed, "grpc-go's server does not treat DATA on an idle stream as a connection error (it ignores it)"},
	"http2/5.1/2":  {failed, "grpc-go's server does not treat RST_STREAM on an idle stream as a connection error (it ignores it)"},
	"http2/5.1/3":  {failed, "grpc-go's server does not treat WINDOW_UPDATE on an idle stream as a connection error (it ignores it)"},
	"http2/5.1/5":  {failed, "grpc-go's server does not answer DATA on a half-closed (remote) stream with STREAM_CLOSED (it ignores it)"},
	"http2/5.1/8":  {failed, "grpc-go's server does not answer DATA on a stream the client reset with STREAM_CLOSED (it ignores it)"},
	"http2/5.1/11": {failed, "grpc-go's server does not answer DATA on a closed stream with STREAM_CLOSED (it ignores it)"},
	"http2/6.1/2":  {failed, "grpc-go's server does not answer DATA on a half-closed (remote) stream with STREAM_CLOSED (it ignores it)"},
	"http2/6.4/2":  {failed, "grpc-go's server does not treat RST_STREAM on an idle stream as a connection error (it ignores it)"},

	"http2/5.1.2/1": {skipped, "grpc-go's server does not advertise SETTINGS_MAX_CONCURRENT_STREAMS (unlimited by default): no limit to exceed"},

	"http2/5.3.1/1": {failed, "grpc-go's server does not check a HEADERS frame's priority for a dependency on its own stream"},
	"http2/5.3.1/2": {failed, "grpc-go's server does not check a PRIORITY frame for a dependency on its own stream"},

	"http2/6.5.2/1": {failed, "grpc-go's server does not check SETTINGS_ENABLE_PUSH's value (it acknowledges 2)"},
	"http2/6.5.2/3": {failed, "grpc-go's server does not check SETTINGS_MAX_FRAME_SIZE's lower bound (it acknowledges 16383)"},
	"http2/6.5.2/4": {failed, "grpc-go's server does not check SETTINGS_MAX_FRAME_SIZE's upper bound (it acknowledges 2^24)"},

	"http2/6.5.3/1": {skipped, "grpc-go's server does not answer with DATA: h2spec has no window to measure"},
	"http2/6.9.1/1": {skipped, "grpc-go's server does not answer with DATA: h2spec has no window to measure"},
	"http2/6.9.2/1": {skipped, "grpc-go's server does not answer with DATA: h2spec has no window to measure"},
	"http2/6.9.2/2": {skipped, "grpc-go's server does not answer with DATA: h2spec has no window to measure"},

	"http2/6.9.1/2": {failed, "grpc-go's server does not treat a connection window past 2^31-1 as a FLOW_CONTROL_ERROR"},
	"http2/6.9.1/3": {failed, "grpc-go's server does not see the stream's window pass 2^31-1: it has answered (415) and reset the stream already"},

	"http2/8.1.2.2/2": {failed, "grpc-go's server does not reject a TE header other than \"trailers\" with PROTOCOL_ERROR (it answers 415)"},
	"http2/8.1.2.3/1": {failed, "grpc-go's server does not reject an empty :path with PROTOCOL_ERROR (it answers 415)"},
	"http2/8.1.2.3/2": {failed, "grpc-go's server does not reject a request without :method with PROTOCOL_ERROR (it answers 415)"},
	"http2/8.1.2.3/3": {failed, "grpc-go's server does not reject a request without :scheme with PROTOCOL_ERROR (it answers 415)"},
	"http2/8.1.2.3/4": {failed, "grpc-go's server does not reject a request without :path with PROTOCOL_ERROR (it answers 415)"},
	"http2/8.1.2.6/1": {failed, "grpc-go's server does not check content-length against the DATA received"},
	"http2/8.1.2.6/2": {failed, "grpc-go's server does not check content-length against the DATA received"},

	"http2/8.2/1": {failed, "grpc-go's server does not treat a client's PUSH_PROMISE as a connection error (it ignores it)"},

	// The client writes more frames after the one in error. grpc-go's
	// server closes at that error without a GOAWAY: the case passes when
	// all the frames came in one read, and fails (a reset, not a close)
	// when the server closed before the last of them came, which a busy
	// machine or the race detector makes likely enough.
	"http2/4.3/2": {timing, "grpc-go's server does not send GOAWAY (PRIORITY inside a header block), " +
		"and may close before the client's CONTINUATION comes"},
	"http2/4.3/3": {timing, "grpc-go's server does not send GOAWAY (HEADERS inside another's header block), " +
		"and may close before the client's CONTINUATION comes"},
	"http2/6.2/1": {timing, "grpc-go's server does not send GOAWAY (PRIORITY inside a header block), " +
		"and may close before the client's CONTINUATION comes"},
	"http2/6.2/2": {timing, "grpc-go's server does not send GOAWAY (HEADERS inside another's header block), " +
		"and may close before the client's CONTINUATION comes"},
	"http2/5.5/2": {timing, "grpc-go's server does not send GOAWAY (an unknown frame inside a header block), " +
		"and may close before the client's CONTINUATION comes"},
	"http2/6.10/6": {timing, "grpc-go's server does not send GOAWAY (DATA inside a header block), and may close before the client's CONTINUATIONs come"},
}

func TestH2spec(t *testing.T) {
	bin := h2specBinary(t)
	cases := h2specCases(t, bin)

	t.Run("grpcunary", func(t *testing.T) {
		t.Parallel()
		_, addr := serveRaw(t, Options{}, &testService{})
		results := runH2spec(t, bin, addr, cases, nil)
		n := 0
		for _, c := range cases {
			if r := results[c.id]; r.outcome != passed {
				t.Errorf("h2spec %s (%s): %s\n%s", c.id, c.desc, r.outcome, r.detail)
				continue
			}
			n++
		}
		t.Logf("h2spec: %d of %d cases passed", n, len(cases))
	})

	t.Run("grpc-go", func(t *testing.T) {
		t.Parallel()
		for id := range grpcGoKnown {
			if !slices.ContainsFunc(cases, func(c h2specCase) bool { return c.id == id }) {
				t.Errorf("grpcGoKnown lists %s, which is not an h2spec case", id)
			}
		}
		s := grpc.NewServer()
		testgrpc.RegisterTestServiceServer(s, &testService{})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- s.Serve(ln) }()
		defer func() {
			s.Stop()
			if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				t.Errorf("Serve: %v", err)
			}
		}()
		results := runH2spec(t, bin, ln.Addr().String(), cases, grpcGoKnown)
		count := map[outcome]int{}
		var byTiming []string
		for _, c := range cases {
			r := results[c.id]
			count[r.outcome]++
			if grpcGoKnown[c.id].want == timing {
				byTiming = append(byTiming, c.id+" "+string(r.outcome))
			}
			known, listed := grpcGoKnown[c.id]
			want := passed
			if listed {
				want = known.want
			}
			switch {
			case r.outcome == want, want == timing && (r.outcome == failed || r.outcome == passed):
			case !listed:
				t.Errorf("h2spec %s (%s): grpc-go's server no longer passes it (%s); if grpc-go changed, add it to grpcGoKnown with the reason\n%s",
					c.id, c.desc, r.outcome, r.detail)
			case r.outcome == passed:
				t.Errorf("h2spec %s (%s): grpc-go's server passes it now; grpcGoKnown says %s (%s): remove it from the list",
					c.id, c.desc, known.want, known.reason)
			default:
				t.Errorf("h2spec %s (%s): grpc-go's server: %s, grpcGoKnown says %s (%s)\n%s", c.id, c.desc, r.outcome, known.want, known.reason, r.detail)
			}
		}
		t.Logf("h2spec: %d cases: %d passed, %d failed, %d skipped; by timing: %s",
			len(cases), count[passed], count[failed], count[skipped], strings.Join(byTiming, ", "))
	})
}

// h2specBinary finds h2spec on PATH or in GOBIN, and checks that it is the
// version .ci/tools.sh pins: the known failures are that version's.
func h2specBinary(t *testing.T) string {
	t.Helper()
	script, err := os.ReadFile("../../.ci/tools.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^H2SPEC_VERSION=(\S+)`).FindSubmatch(script)
	if m == nil {
		t.Fatal(".ci/tools.sh has no H2SPEC_VERSION= line")
	}
	pin := string(m[1])

	bin, err := exec.LookPath("h2spec")
	if err != nil {
		for _, dir := range goBinDirs() {
			if p := filepath.Join(dir, "h2spec"); isExecutable(p) {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		t.Fatalf("h2spec is not on PATH nor in GOBIN (%s): run `make tools` (.ci/tools.sh) to install h2spec %s", strings.Join(goBinDirs(), ", "), pin)
	}
	// Reading the binary also makes it part of go test's cache key.
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatalf("%s: %v: run `make tools` (.ci/tools.sh) to install h2spec %s", bin, err, pin)
	}
	if info.Main.Path != "github.com/summerwind/h2spec" || info.Main.Version != pin {
		t.Fatalf("%s is %s %s, .ci/tools.sh pins github.com/summerwind/h2spec %s: run `make tools` (.ci/tools.sh)",
			bin, info.Main.Path, info.Main.Version, pin)
	}
	return bin
}

// goBinDirs are where `go install` puts binaries: GOBIN, or GOPATH's bin.
func goBinDirs() []string {
	var dirs []string
	if gobin := os.Getenv("GOBIN"); gobin != "" {
		dirs = append(dirs, gobin)
	}
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) == 2 {
			if lines[0] != "" {
				dirs = append(dirs, lines[0])
			}
			for _, p := range filepath.SplitList(lines[1]) {
				dirs = append(dirs, filepath.Join(p, "bin"))
			}
		}
	}
	for _, p := range filepath.SplitList(build.Default.GOPATH) {
		dirs = append(dirs, filepath.Join(p, "bin"))
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// h2specCase is one of h2spec's cases: id as h2spec takes it on its
// command line (generic/2/3, http2/6.5.2/1, hpack/4.2/1).
type h2specCase struct {
	id, desc string
}

// h2specRoots are the titles of h2spec's three specs, by their ids.
var h2specRoots = map[string]string{
	"Generic tests for HTTP/2 server":                "generic",
	"Hypertext Transfer Protocol Version 2 (HTTP/2)": "http2",
	"HPACK: Header Compression for HTTP/2":           "hpack",
}

var (
	h2specGroupLine = regexp.MustCompile(`^\s+((?:\d+\.)+) \S`)
	h2specCaseLine  = regexp.MustCompile(`^\s+(\d+): (.*)$`)
)

// h2specCases lists the cases `h2spec --dryrun` would run.
func h2specCases(t *testing.T, bin string) []h2specCase {
	t.Helper()
	out, err := exec.Command(bin, "--dryrun").CombinedOutput()
	if err != nil {
		t.Fatalf("h2spec --dryrun: %v\n%s", err, out)
	}
	var cases []h2specCase
	var root, group string
	for line := range strings.Lines(string(out)) {
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.TrimSpace(line) == "":
		case !strings.HasPrefix(line, " "):
			var ok bool
			if root, ok = h2specRoots[line]; !ok {
				t.Fatalf("h2spec --dryrun: unknown spec %q", line)
			}
			group = ""
		case h2specGroupLine.MatchString(line):
			group = strings.TrimSuffix(h2specGroupLine.FindStringSubmatch(line)[1], ".")
		case h2specCaseLine.MatchString(line):
			m := h2specCaseLine.FindStringSubmatch(line)
			if root == "" || group == "" {
				t.Fatalf("h2spec --dryrun: case outside a group: %q", line)
			}
			cases = append(cases, h2specCase{id: root + "/" + group + "/" + m[1], desc: m[2]})
		default:
			t.Fatalf("h2spec --dryrun: unexpected line %q", line)
		}
	}
	if len(cases) != h2specCaseCount {
		t.Fatalf("h2spec --dryrun lists %d cases, want %d\n%s", len(cases), h2specCaseCount, out)
	}
	return cases
}

// h2specResult is a case's outcome, with h2spec's report of a case that
// did not pass.
type h2specResult struct {
	outcome outcome
	detail  string
}

// runH2spec runs cases against addr: those in alone each in its own h2spec
// process (the cases expected to fail, which wait for the timeout), all at
// once, and the others in one more process.
func runH2spec(t *testing.T, bin, addr string, cases []h2specCase, alone map[string]knownCase) map[string]h2specResult {
	t.Helper()
	var batches [][]h2specCase
	var rest []h2specCase
	for _, c := range cases {
		if _, ok := alone[c.id]; ok {
			batches = append(batches, []h2specCase{c})
		} else {
			rest = append(rest, c)
		}
	}
	if len(rest) > 0 {
		batches = append(batches, rest)
	}
	dir := t.TempDir()
	var (
		mu      sync.Mutex
		results = map[string]h2specResult{}
		wg      sync.WaitGroup
	)
	for i, batch := range batches {
		wg.Go(func() {
			r := runH2specBatch(bin, addr, filepath.Join(dir, strconv.Itoa(i)+".xml"), batch)
			mu.Lock()
			maps.Copy(results, r)
			mu.Unlock()
		})
	}
	wg.Wait()
	return results
}

// junitReport is what h2spec's JUnit report holds of its results.
type junitReport struct {
	Suites []struct {
		Package string `xml:"package,attr"`
		Cases   []struct {
			Desc    string     `xml:"classname,attr"`
			Failure *junitText `xml:"failure"`
			Error   *junitText `xml:"error"`
			Skipped *junitText `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

type junitText struct {
	Text string `xml:",chardata"`
}

// runH2specBatch runs cases in one h2spec process and reads their outcomes
// from its JUnit report, where a case is known by its group and its
// description (unique within a group).
func runH2specBatch(bin, addr, report string, cases []h2specCase) map[string]h2specResult {
	host, port, _ := net.SplitHostPort(addr)
	args := []string{"-h", host, "-p", port, "-P", h2specPath, "-o", strconv.Itoa(h2specTimeout), "-j", report}
	ids := map[string]string{} // by group and description
	for _, c := range cases {
		args = append(args, c.id)
		ids[path.Dir(c.id)+"\n"+c.desc] = c.id
	}
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run() // exit status 1 when a case fails
	results := map[string]h2specResult{}
	noResult := func(format string, args ...any) map[string]h2specResult {
		detail := fmt.Sprintf(format, args...) + fmt.Sprintf(" (h2spec: %v)\n%s", runErr, out.Bytes())
		for _, c := range cases {
			if _, ok := results[c.id]; !ok {
				results[c.id] = h2specResult{outcome: "no result", detail: detail}
			}
		}
		return results
	}
	b, err := os.ReadFile(report)
	if err != nil {
		return noResult("no JUnit report: %v", err)
	}
	var rep junitReport
	if err := xml.Unmarshal(b, &rep); err != nil {
		return noResult("JUnit report: %v", err)
	}
	for _, s := range rep.Suites {
		for _, c := range s.Cases {
			id, ok := ids[s.Package+"\n"+c.Desc]
			if !ok {
				return noResult("JUnit report: a result for a case not run: %s %q", s.Package, c.Desc)
			}
			r := h2specResult{outcome: passed}
			switch {
			case c.Failure != nil:
				r = h2specResult{failed, c.Failure.Text}
			case c.Error != nil:
				// A TestError: the events expected, a line each, then
				// the one that came.
				lines := strings.Split(strings.TrimSpace(c.Error.Text), "\n")
				r = h2specResult{failed, fmt.Sprintf("expected: %s\nactual: %s",
					strings.Join(lines[:len(lines)-1], " or "), lines[len(lines)-1])}
			case c.Skipped != nil:
				r = h2specResult{outcome: skipped}
			}
			results[id] = r
		}
	}
	if len(results) != len(cases) {
		return noResult("JUnit report: %d results for %d cases", len(results), len(cases))
	}
	return results
}
