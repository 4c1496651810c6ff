package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// freeAddr returns a free loopback address.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// process is a child process whose output is kept in a file for the error
// report.
type process struct {
	name   string
	cmd    *exec.Cmd
	logs   string
	exited chan error
}

// start runs path with args, and env added to the bench's environment.
func start(name, logPath string, env []string, path string, args ...string) (*process, error) {
	if len(env) > 0 {
		env = append(os.Environ(), env...)
	}
	return launch(name, logPath, env, path, args...)
}

// launch runs path with args in the environment env alone (the bench's
// when env is nil).
func launch(name, logPath string, env []string, path string, args ...string) (*process, error) {
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	p := &process{name: name, cmd: exec.Command(path, args...), logs: logPath, exited: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.Env = env
	// Killed with the bench, however it ends: no stray servers on a shared machine.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		_ = out.Close() // nothing was written: the start's error is the one to report
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.exited <- p.cmd.Wait()
		_ = out.Close() // the process wrote its log; tail reads what is there
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// alive returns an error when the process has exited, with its last output.
func (p *process) alive() error {
	select {
	case err := <-p.exited:
		p.exited <- err
		return fmt.Errorf("%s exited (%v):\n%s", p.name, err, tail(p.logs, 2000))
	default:
		return nil
	}
}

// stop asks the process to end (SIGTERM), and kills it after grace.
func (p *process) stop(grace time.Duration) {
	if p.alive() != nil {
		return
	}
	// Signal and Kill fail only when the process has exited: exited says so.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		p.exited <- <-p.exited
	}
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// waitFor polls ready until it succeeds, the process dies or timeout passes.
func waitFor(p *process, timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if dead := p.alive(); dead != nil {
			return dead
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w", p.name, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startRedis starts redis-server on a free loopback port, without
// persistence.
func startRedis(dir string) (*process, *redis.Client, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, nil, "", err
	}
	_, port, _ := net.SplitHostPort(addr)
	p, err := start("redis-server", filepath.Join(dir, "redis.log"), nil, "redis-server",
		"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err != nil {
		return nil, nil, "", err
	}
	client := redis.NewClient(&redis.Options{Addr: addr})
	err = waitFor(p, 10*time.Second, func() error { return client.Ping(context.Background()).Err() })
	if err != nil {
		_ = client.Close() // the wait's error is the one to report
		p.stop(time.Second)
		return nil, nil, "", err
	}
	return p, client, addr, nil
}

// service is the running ratelimit binary.
type service struct {
	*process
	grpcAddr, httpAddr string
}

// buildService builds the service binary into dir (no -race: this measures
// what ships).
func buildService(root, dir string) (string, error) {
	bin := filepath.Join(dir, "ratelimit")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/ratelimit")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/ratelimit: %w", err)
	}
	return bin, nil
}

// startService runs the service at its shipped defaults: only the flags
// that say where to listen and which config and Redis to use, then extra
// (-service-arg, BENCH_FLAGS), and --pprof when profiling. Its environment
// is the bench's without RATELIMIT_* (the service reads its flags from
// them) and without the Go runtime's knobs (GOGC, GOMEMLIMIT, GOMAXPROCS,
// GODEBUG), so that nothing set in the shell changes what is measured;
// env (-service-env) is added after. It returns the service's arguments
// for the report.
func startService(bin, dir, configPath, redisAddr string, extra, env []string, pprof bool) (*service, []string, error) {
	grpcAddr, err := freeAddr()
	if err != nil {
		return nil, nil, err
	}
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, nil, err
	}
	args := []string{
		"--config", configPath,
		"--grpc-addr", grpcAddr, "--http-addr", httpAddr,
		"--redis-url", "redis://" + redisAddr,
	}
	if pprof {
		args = append(args, "--pprof")
	}
	args = append(args, extra...)
	p, err := start("ratelimit", filepath.Join(dir, "ratelimit.log"), serviceEnv(os.Environ(), env), bin, args...)
	if err != nil {
		return nil, nil, err
	}
	s := &service{process: p, grpcAddr: grpcAddr, httpAddr: httpAddr}
	err = waitFor(p, 20*time.Second, func() error {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close() // only the status is read
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		p.stop(time.Second)
		return nil, nil, err
	}
	return s, args, nil
}

// serviceEnv is the service's environment: base without the variables that
// would change its defaults, then extra.
func serviceEnv(base, extra []string) []string {
	out := []string{}
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "RATELIMIT_"),
			name == "GOGC", name == "GOMEMLIMIT", name == "GOMAXPROCS", name == "GODEBUG":
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

// counters reads the service's failure counters from /metrics (see
// parseCounters).
func (s *service) counters() (map[string]float64, error) {
	resp, err := http.Get("http://" + s.httpAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return parseCounters(resp.Body)
}

// Names of the counters parseCounters returns, beside the decision outcomes
// whose name starts with failurePrefix.
const (
	failurePrefix  = "failure_" // ratelimit_decisions_total{outcome="failure_allow"}: the rule's failure mode answered
	storeErrPrefix = "store:"   // store:<kind>: ratelimit_store_errors_total{kind="<kind>"}
	shedCounter    = "shed"     // ratelimit_requests_shed_total: refused past --max-inflight
)

// parseCounters reads the service's Prometheus text and returns, summed
// over the other labels, the decisions answered by a failure mode by
// outcome (failure_allow, failure_deny: whatever outcome starts with
// "failure_"), the store errors by kind (store:timeout, ...) and the shed
// requests. Only what the service exports is read: a label
// the service adds later is summed over, an outcome or kind it adds shows
// up under its own name.
func parseCounters(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("/metrics: %q: %w", line, err)
		}
		switch name {
		case "ratelimit_decisions_total":
			if o := labels["outcome"]; strings.HasPrefix(o, failurePrefix) {
				out[o] += value
			}
		case "ratelimit_store_errors_total":
			out[storeErrPrefix+labels["kind"]] += value
		case "ratelimit_requests_shed_total":
			out[shedCounter] += value
		}
	}
	return out, sc.Err()
}

// parseSample splits a sample line of the Prometheus text format,
// name{label="value",...} value [timestamp].
func parseSample(line string) (name string, labels map[string]string, value float64, err error) {
	labels = map[string]string{}
	rest := line
	if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
		name, rest = line[:i], line[i+1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			k, v, ok := strings.Cut(rest, "=\"")
			if !ok {
				return "", nil, 0, errors.New("bad labels")
			}
			var b strings.Builder
			i := 0
			for ; i < len(v) && v[i] != '"'; i++ {
				if v[i] == '\\' && i+1 < len(v) {
					i++
					switch v[i] {
					case 'n':
						b.WriteByte('\n')
					default:
						b.WriteByte(v[i])
					}
					continue
				}
				b.WriteByte(v[i])
			}
			if i == len(v) {
				return "", nil, 0, errors.New("unterminated label value")
			}
			labels[strings.TrimSpace(k)] = b.String()
			rest = v[i+1:]
		}
	} else {
		name, rest, _ = strings.Cut(line, " ")
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", nil, 0, errors.New("no value")
	}
	value, err = strconv.ParseFloat(f[0], 64)
	return name, labels, value, err
}

// cpuTime is a process's user + system CPU time so far, from
// /proc/<pid>/stat (all its threads).
func cpuTime(pid int, tick float64) (time.Duration, error) {
	path := "/proc/self/stat"
	if pid > 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/stat"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseStat(string(b), tick)
}

// parseStat reads utime and stime (fields 14 and 15) of a stat line. The
// command name, field 2, is in parentheses and may hold spaces.
func parseStat(line string, tick float64) (time.Duration, error) {
	end := strings.LastIndexByte(line, ')')
	if end < 0 {
		return 0, errors.New("stat: no command name")
	}
	f := strings.Fields(line[end+1:]) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, errors.New("stat: too few fields")
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat: %w", err)
	}
	return time.Duration(float64(utime+stime) / tick * float64(time.Second)), nil
}

// clockTick is the unit of /proc/<pid>/stat times: getconf CLK_TCK, or 100.
func clockTick() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
}
