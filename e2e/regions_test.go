package e2e

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidingwindow/ratelimit/internal/netproxy"
)

// regionsConfig is one global limit of 60 per 3 s, each region keeping a
// tenth of it whatever happens (6), within which a cut region decides.
const regionsConfig = `domain: global
descriptors:
  - key: customer
    rate_limit:
      unit: second
      unit_multiplier: 3
      requests_per_unit: 60
      algorithm: sliding_window_log
      global: true
      regional_share: 0.1
      when_cut: share
`

const (
	regionsLimit  = 60
	regionsFloor  = 6
	regionsWindow = 3 * time.Second
	regionsLease  = 2 * time.Second // a turn, half a second, holds a new connection's round trips to the ledger
)

// regionAdmission is one admitted call: decided between sent and answered.
type regionAdmission struct {
	region         string
	sent, answered time.Time
}

// mostWithin returns the most admissions of the regions named (all for
// none) certainly within one window (sent at or after its start, answered
// by its end), over every window ending at an answer from from on.
func mostWithin(all []regionAdmission, from time.Time, regions ...string) int {
	of := func(a regionAdmission) bool {
		if len(regions) == 0 {
			return true
		}
		for _, r := range regions {
			if a.region == r {
				return true
			}
		}
		return false
	}
	most := 0
	for _, end := range all {
		if end.answered.Before(from) || !of(end) {
			continue
		}
		n := 0
		for _, a := range all {
			if of(a) && !a.sent.Before(end.answered.Add(-regionsWindow)) && !a.answered.After(end.answered) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// TestRegionsOneLimit runs three regions, each with its own redis-server
// and instances (two in us), and a ledger each region reaches through a
// proxy adding 50 ms to each command: demand at twice the limit in us,
// then in eu while us keeps a little; eu cut from the ledger for two
// windows, then healed. In any window the regions together admit at most
// the limit; the region demand moved to is granted what the other gave
// up; cut, eu decides within its floor once its grant's lease ended; healed,
// it is granted again.
func TestRegionsOneLimit(t *testing.T) {
	t.Parallel()
	ledger := startRedis(t)
	type region struct {
		name    string
		redis   *redisServer
		proxy   *netproxy.Proxy
		port    int
		servers []*server
	}
	var regions []*region
	for _, name := range []string{"us", "eu", "ap"} {
		r := &region{name: name, redis: startRedis(t), port: freePort(t)}
		r.proxy = startProxy(t, r.port, ledger.addr)
		setDelay(r.proxy, 50*time.Millisecond)
		instances := 1
		if name == "us" {
			instances = 2
		}
		for range instances {
			r.servers = append(r.servers, startServer(t, r.redis, regionsConfig, "--region", name, "--regions", "3",
				"--ledger-redis-url", "redis://127.0.0.1:"+strconv.Itoa(r.port),
				"--global-lease", regionsLease.String(), "--global-refresh", "100ms"))
		}
		regions = append(regions, r)
	}
	var mu sync.Mutex
	var all []regionAdmission
	req := request("global", descriptor("customer", "acme"))
	// drive sends from every instance of r, each a call every every, for d.
	drive := func(r *region, every, d time.Duration, wg *sync.WaitGroup) {
		for _, s := range r.servers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(every)
				defer tick.Stop()
				stop := time.After(d)
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					sent := time.Now()
					resp, err := s.rls.ShouldRateLimit(ctx, req)
					cancel()
					if err != nil {
						t.Errorf("%s: %v", r.name, err)
						return
					}
					if resp.OverallCode == rlsv3.RateLimitResponse_OK {
						mu.Lock()
						all = append(all, regionAdmission{r.name, sent, time.Now()})
						mu.Unlock()
					}
				}
			}()
		}
	}
	us, eu, ap := regions[0], regions[1], regions[2]
	perSecond := func(n float64) time.Duration { return time.Duration(float64(time.Second) / n) }
	// Twice the limit's rate (40/s) in us over its two instances; then in
	// eu, with us at a quarter of it and ap at a tenth.
	var wg sync.WaitGroup
	drive(us, perSecond(20), 3*regionsWindow, &wg)
	wg.Wait()
	moved := time.Now()
	drive(eu, perSecond(40), 6*regionsWindow, &wg)
	drive(us, perSecond(5), 6*regionsWindow, &wg)
	drive(ap, perSecond(4), 6*regionsWindow, &wg)
	time.Sleep(2 * regionsWindow)
	cut := time.Now()
	eu.proxy.Close() // eu's link to the ledger is cut
	time.Sleep(2 * regionsWindow)
	healed := time.Now()
	eu.proxy = startProxy(t, eu.port, ledger.addr)
	setDelay(eu.proxy, 50*time.Millisecond)
	wg.Wait()
	end := time.Now()

	mu.Lock()
	defer mu.Unlock()
	count := func(name string, from, to time.Time) int {
		n := 0
		for _, a := range all {
			if a.region == name && !a.sent.Before(from) && !a.answered.After(to) {
				n++
			}
		}
		return n
	}
	if most := mostWithin(all, time.Time{}); most > regionsLimit {
		t.Errorf("the regions admitted %d within one window, over the limit %d", most, regionsLimit)
	}
	// eu before the cut: more than its floor's 6 a window over the two
	// windows after the move means it was granted what us gave up.
	if n := count("eu", moved, cut); n <= 2*regionsFloor {
		t.Errorf("eu admitted %d in the two windows after the demand moved there: no more than its floor", n)
	}
	// Cut, eu decides with its grant until its lease ends, then within its
	// floor: what it admits from then on until the heal, within any
	// window, is at most the floor.
	var cutMost int
	for _, a := range all {
		if a.region != "eu" || a.answered.After(healed) || a.sent.Before(cut.Add(regionsLease)) {
			continue
		}
		n := 0
		for _, b := range all {
			if b.region == "eu" && !b.sent.Before(maxTime(cut.Add(regionsLease), a.answered.Add(-regionsWindow))) && !b.answered.After(a.answered) {
				n++
			}
		}
		cutMost = max(cutMost, n)
	}
	if cutMost > regionsFloor {
		t.Errorf("eu admitted %d within a window of its lease's end while cut, past its floor %d", cutMost, regionsFloor)
	}
	// Healed, it is granted again.
	if n := count("eu", healed.Add(regionsLease), end); n <= regionsFloor {
		t.Errorf("eu admitted %d after the link healed: no more than its floor", n)
	}
	t.Logf("admitted: %d in all, most in a window %d; eu %d after the move, %d while cut, %d once healed",
		len(all), mostWithin(all, time.Time{}), count("eu", moved, cut), count("eu", cut, healed), count("eu", healed, end))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestRegionsRefuseBadInput: a region without a ledger, and a global rule
// without a ledger and region, refuse to start with a clear error; a
// ledger down at start is a partition, not a crash.
func TestRegionsRefuseBadInput(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	dir := t.TempDir()
	writeFile(t, dir+"/config.yaml", regionsConfig)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--region", "us"}, "--region and a ledger"},
		{[]string{"--ledger-redis-url", "redis://" + r.addr}, "--region and a ledger"},
		{nil, "global needs a ledger and this instance's region"},
		{[]string{"--region", "us", "--regions", "11", "--ledger-redis-url", "redis://" + r.addr}, "regional_share 0.1 for each of 11 regions is more than the limit"},
	} {
		args := append([]string{"--config", dir, "--redis-url", "redis://" + r.addr, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, tc.args...)
		out, err := exec.Command(binary, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%v: exit %v, want an error with %q:\n%s", tc.args, err, tc.want, out)
		}
	}
	// The ledger's port answers nothing: the service starts, and decides the
	// global rule within its floor.
	s := startServer(t, r, regionsConfig, "--region", "us", "--regions", "3",
		"--ledger-redis-url", "redis://127.0.0.1:"+strconv.Itoa(freePort(t)), "--global-lease", "1s", "--global-refresh", "100ms")
	admitted := 0
	for range 2 * regionsFloor {
		if s.ask(t, request("global", descriptor("customer", "acme"))).OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != regionsFloor {
		t.Errorf("with the ledger down, %d of %d admitted: want the floor, %d", admitted, 2*regionsFloor, regionsFloor)
	}
}
