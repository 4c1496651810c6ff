package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
)

// Hit is one decide-script hit of a group, as the service would send it.
type Hit struct {
	Key  string   // the store key; __rand_int__ stands for the 10k values
	Args []string // ARGV: charge flag, then algorithm, limit, window µs, cost, shadow
}

// hitOf crafts the script call of one hit of g, from the rule the service
// would match, with the service's key schema (see decide.lua for ARGV).
func hitOf(cfg *config.Config, g Group) (Hit, error) {
	ruleKey := g.RuleKey()
	rule := config.Match(cfg, domain, []*rlcommon.RateLimitDescriptor_Entry{{Key: ruleKey, Value: "0"}})
	if rule == nil || rule.Unlimited {
		return Hit{}, fmt.Errorf("the bench config has no limited rule for %s=<value> in domain %s", ruleKey, domain)
	}
	value := "0"
	if g.Keys > 1 {
		value = "__rand_int__" // redis-benchmark -r replaces it with a random number below the keyspace
	}
	var kb limiter.KeyBuilder
	kb.Reset(domain)
	kb.Add(ruleKey, value)
	alg := map[config.Algorithm]string{config.SlidingWindowLog: "1", config.SlidingWindowCounter: "2", config.FixedWindow: "3"}[rule.Algorithm]
	return Hit{
		Key: kb.Key(rule.Algorithm, rule.Window()),
		Args: []string{"1", alg, strconv.FormatUint(uint64(rule.RequestsPerUnit), 10),
			strconv.FormatInt(rule.Window().Microseconds(), 10), "1", "0"},
	}, nil
}

// chargeCommand is the command an admitted hit of the algorithm runs once:
// counting its calls in INFO commandstats counts the admitted hits.
func chargeCommand(alg string) string {
	if alg == "log" {
		return "zadd"
	}
	return "incrby"
}

// Ceiling is what Redis alone does with the scenario's script hit, driven by
// redis-benchmark: no service in between.
type Ceiling struct {
	Pipeline   int
	Calls      uint64        // EVALSHA calls
	Elapsed    time.Duration // wall time of the measured redis-benchmark run
	PerSecond  float64       // EVALSHA calls per second, as redis-benchmark reports
	RedisCPU   time.Duration // CPU of the redis-server process over the run
	ScriptTime time.Duration // script execution time per call, from INFO commandstats
	Admitted   float64       // share of the calls whose hit was admitted (charged)
	P50, P99   string        // redis-benchmark's latencies, ms
}

func (c *Ceiling) CPUPerCall() time.Duration {
	if c.Calls == 0 {
		return 0
	}
	return c.RedisCPU / time.Duration(c.Calls)
}

// ceilingRunner runs redis-benchmark against the bench's redis-server.
type ceilingRunner struct {
	host, port string
	redisPid   int
	tick       float64
	client     *redis.Client
	sha        string
}

// run measures one hit at one pipeline depth for about d: a short probe
// sizes -n, then the measured run. The database is flushed first.
func (cr *ceilingRunner) run(ctx context.Context, g Group, h Hit, pipeline int, d time.Duration) (*Ceiling, error) {
	probe := 5_000
	if pipeline > 1 {
		probe = 20_000
	}
	rps, _, err := cr.bench(ctx, g, h, pipeline, probe)
	if err != nil {
		return nil, err
	}
	n := max(probe, int(rps*d.Seconds()))
	if err := cr.client.FlushAll(ctx).Err(); err != nil {
		return nil, err
	}
	if err := cr.client.ConfigResetStat(ctx).Err(); err != nil {
		return nil, err
	}
	cpu0, err := cpuTime(cr.redisPid, cr.tick)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	rps, lat, err := cr.bench(ctx, g, h, pipeline, n)
	if err != nil {
		return nil, err
	}
	elapsed := time.Since(t0)
	cpu1, err := cpuTime(cr.redisPid, cr.tick)
	if err != nil {
		return nil, err
	}
	stats, err := commandStats(ctx, cr.client)
	if err != nil {
		return nil, err
	}
	c := &Ceiling{
		Pipeline: pipeline, Calls: uint64(n), Elapsed: elapsed, PerSecond: rps, RedisCPU: cpu1 - cpu0,
		P50: lat[0], P99: lat[1],
	}
	if e := stats["evalsha"]; e.Calls > 0 {
		c.ScriptTime = e.Usec / time.Duration(e.Calls)
		c.Admitted = float64(stats[chargeCommand(g.Alg)].Calls) / float64(e.Calls)
		if e.Failed > 0 {
			return nil, fmt.Errorf("redis-benchmark: %d of %d EVALSHA calls failed", e.Failed, e.Calls)
		}
	}
	return c, cr.client.FlushAll(ctx).Err()
}

// bench runs redis-benchmark once: 50 clients, n calls, and returns the
// calls per second with the p50 and p99 latencies it reports.
func (cr *ceilingRunner) bench(ctx context.Context, g Group, h Hit, pipeline, n int) (float64, [2]string, error) {
	args := []string{"-h", cr.host, "-p", cr.port, "-c", "50", "-n", strconv.Itoa(n),
		"-P", strconv.Itoa(pipeline), "--csv"}
	if g.Keys > 1 {
		args = append(args, "-r", strconv.Itoa(g.Keys))
	}
	args = append(args, "EVALSHA", cr.sha, "1", h.Key)
	args = append(args, h.Args...)
	out, err := exec.CommandContext(ctx, "redis-benchmark", args...).CombinedOutput()
	if err != nil {
		return 0, [2]string{}, fmt.Errorf("redis-benchmark: %w\n%s", err, out)
	}
	return parseBenchmarkCSV(string(out))
}

// parseBenchmarkCSV reads redis-benchmark --csv output: a header, then
// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms".
func parseBenchmarkCSV(out string) (float64, [2]string, error) {
	var lat [2]string
	r := csv.NewReader(strings.NewReader(out))
	r.FieldsPerRecord = -1
	records, err := r.ReadAll()
	if err != nil {
		return 0, lat, fmt.Errorf("redis-benchmark output: %w\n%s", err, out)
	}
	var header []string
	for _, rec := range records {
		if len(rec) > 1 && rec[0] == "test" {
			header = rec
			continue
		}
		if header == nil || len(rec) != len(header) {
			continue
		}
		col := map[string]string{}
		for i, h := range header {
			col[h] = rec[i]
		}
		rps, err := strconv.ParseFloat(col["rps"], 64)
		if err != nil {
			return 0, lat, fmt.Errorf("redis-benchmark rps %q: %w", col["rps"], err)
		}
		return rps, [2]string{col["p50_latency_ms"], col["p99_latency_ms"]}, nil
	}
	return 0, lat, errors.New("redis-benchmark printed no result:\n" + out)
}

// cmdStat is one line of INFO commandstats.
type cmdStat struct {
	Calls, Failed uint64
	Usec          time.Duration
}

func commandStats(ctx context.Context, c *redis.Client) (map[string]cmdStat, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	return parseCommandStats(info), nil
}

// parseCommandStats reads lines like
// cmdstat_evalsha:calls=3,usec=120,usec_per_call=40.00,rejected_calls=0,failed_calls=0
func parseCommandStats(info string) map[string]cmdStat {
	out := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseUint(v, 10, 64)
			switch k {
			case "calls":
				st.Calls = n
			case "usec":
				st.Usec = time.Duration(n) * time.Microsecond
			case "failed_calls":
				st.Failed = n
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}
