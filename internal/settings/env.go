package settings

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// The environment of envoyproxy/ratelimit (the reference), so that its
// deployments (Envoy Gateway's, Istio's sample) switch by changing the
// image. A flag on the command line wins, then RATELIMIT_<FLAG>, then the
// reference's variable, then the flag's default.

// envLookup reads one variable: its value and whether it is set (an empty
// value is set, as the reference's envconfig takes it).
type envLookup func(name string) (string, bool)

// Value is a flag value the reference's environment asks for.
type Value struct {
	Flag, Value string
	From        string // the variables it comes from, for messages
}

// Note is logged once at start.
type Note struct {
	Warn bool
	Msg  string
	Vars []string
}

// Plan is what the reference's environment asks for.
type Plan struct {
	Values []Value
	Notes  []Note
	// Redis: a Redis variable of the reference (REDIS_*, BACKEND_TYPE) is set.
	Redis bool
	// inUse: a variable of the reference is set.
	inUse bool
	// redisGroup: the variables set that planRedis reads (names only).
	redisGroup []string
	// perSecondGroup: the variables set that planRedisPerSecond reads.
	perSecondGroup []string

	explicit map[string]bool // flags and groups set on the command line or by RATELIMIT_*
}

// set asks for a flag's value, unless the flag, or its group (set
// together), is set otherwise.
func (p *Plan) set(flag, value, from, group string) {
	if p.explicit[flag] || group != "" && p.explicit[group] {
		return
	}
	p.Values = append(p.Values, Value{Flag: flag, Value: value, From: from})
}

func (p *Plan) note(warn bool, msg string, vars ...string) {
	p.Notes = append(p.Notes, Note{Warn: warn, Msg: msg, Vars: vars})
}

// reference is the table, for its names, groups and variables.
var reference = Table()

// planEnv reads the reference's variables through lookup. explicit says
// which flags the command line or RATELIMIT_* set: those win, and a group
// with one of them is left out whole.
func planEnv(lookup envLookup, explicit func(string) bool) (*Plan, error) {
	p := &Plan{explicit: map[string]bool{}}
	for _, e := range reference {
		if explicit(e.Name) {
			p.explicit[e.Name] = true
			if e.Group != "" {
				p.explicit[e.Group] = true
			}
		}
	}
	get := func(name string) (string, bool) {
		v, ok := lookup(name)
		if ok {
			p.inUse = true
		}
		return v, ok
	}
	for _, e := range reference {
		for _, v := range e.Ref {
			val, ok := get(v.Name)
			if !ok {
				continue
			}
			if strings.HasPrefix(v.Name, "REDIS_") {
				p.Redis = true
			}
			if e.Group == groupRedis {
				p.redisGroup = append(p.redisGroup, v.Name)
			}
			if e.Group == groupRedisPerSecond {
				p.perSecondGroup = append(p.perSecondGroup, v.Name)
			}
			switch {
			case v.Joint: // read by its step below
			case v.Conv != nil:
				val, err := v.Conv(val)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", v.Name, err)
				}
				if val != "" { // "": the flag keeps its value
					p.set(e.Name, val, v.Name, "")
				}
			default:
				p.set(e.Name, val, v.Name, "")
			}
		}
	}
	var unused []string
	for _, v := range noEffect {
		if _, ok := get(v.Name); ok {
			if strings.HasPrefix(v.Name, "REDIS_") || v.Name == "BACKEND_TYPE" {
				p.Redis = true
			}
			unused = append(unused, v.Name)
		}
	}
	if len(unused) > 0 {
		p.note(false, "variables of envoyproxy/ratelimit with no effect here (docs/migration.md)", unused...)
	}
	steps := []func(*Plan, func(string) (string, bool)) error{
		planListeners, planConfigPath, planGRPCTLS, planMetrics, planStatsd, planMisc, planRedis, planRedisPerSecond,
		planDefaultAlgorithm,
	}
	for _, step := range steps {
		if err := step(p, get); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// defaultOf is the reference's default of a variable.
func defaultOf(name string) string {
	for _, e := range reference {
		for _, v := range e.Ref {
			if v.Name == name {
				return v.Default
			}
		}
	}
	for _, v := range noEffect {
		if v.Name == name {
			return v.Default
		}
	}
	return ""
}

// hostPort joins a host and a port variable with the reference's defaults;
// ok is false when neither is set.
func hostPort(get func(string) (string, bool), hostVar, portVar string) (addr string, ok bool, err error) {
	host, hostSet := get(hostVar)
	port, portSet := get(portVar)
	if !hostSet && !portSet {
		return "", false, nil
	}
	if !hostSet {
		host = defaultOf(hostVar)
	}
	if !portSet {
		port = defaultOf(portVar)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", false, fmt.Errorf("%s: %q is not a port number", portVar, port)
	}
	return net.JoinHostPort(host, port), true, nil
}

func planListeners(p *Plan, get func(string) (string, bool)) error {
	if addr, ok, err := hostPort(get, "HOST", "PORT"); err != nil {
		return err
	} else if ok {
		p.set(FlagHTTPAddr, addr, "HOST/PORT", "")
	}
	if uds, ok := get("GRPC_UDS"); ok && uds != "" {
		p.set(FlagGRPCAddr, "unix:"+uds, "GRPC_UDS", "")
	} else if addr, ok, err := hostPort(get, "GRPC_HOST", "GRPC_PORT"); err != nil {
		return err
	} else if ok {
		p.set(FlagGRPCAddr, addr, "GRPC_HOST/GRPC_PORT", "")
	}
	addr, ok, err := hostPort(get, "DEBUG_HOST", "DEBUG_PORT")
	if err != nil {
		return err
	}
	if !ok && p.inUse {
		// The reference always serves its debug port; tools read /rlconfig
		// there (egctl at 6070).
		addr, ok = net.JoinHostPort(defaultOf("DEBUG_HOST"), defaultOf("DEBUG_PORT")), true
	}
	if ok {
		p.set(FlagDebugAddr, addr, "DEBUG_HOST/DEBUG_PORT", "")
	}
	return nil
}

func planConfigPath(p *Plan, get func(string) (string, bool)) error {
	root, rootSet := get("RUNTIME_ROOT")
	sub, subSet := get("RUNTIME_SUBDIRECTORY")
	app, appSet := get("RUNTIME_APPDIRECTORY")
	_, dotSet := get("RUNTIME_IGNOREDOTFILES")
	if !rootSet && !subSet && !appSet && !dotSet {
		return nil
	}
	// The reference reads every file under its directory, dot files too
	// unless RUNTIME_IGNOREDOTFILES: so does the directory it names, but
	// not one --config names.
	skipDots, err := boolVar(get, "RUNTIME_IGNOREDOTFILES")
	if err != nil {
		return err
	}
	if !p.explicit[FlagConfig] {
		files := config.AllFiles
		if skipDots {
			files = config.VisibleFiles
		}
		p.set(FlagConfigFiles, files.String(), "RUNTIME_IGNOREDOTFILES", "")
	}
	if !rootSet && !subSet && !appSet {
		return nil
	}
	if !rootSet {
		root = defaultOf("RUNTIME_ROOT")
	}
	if !appSet {
		app = defaultOf("RUNTIME_APPDIRECTORY")
	}
	p.set(FlagConfig, filepath.Join(root, sub, app), "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY", "")
	return nil
}

func planGRPCTLS(p *Plan, get func(string) (string, bool)) error {
	vars := []struct{ name, flag string }{
		{"GRPC_SERVER_TLS_CERT", FlagGRPCTLSCert}, {"GRPC_SERVER_TLS_KEY", FlagGRPCTLSKey},
		{"GRPC_CLIENT_TLS_CACERT", FlagGRPCTLSClientCA}, {"GRPC_CLIENT_TLS_SAN", FlagGRPCTLSClientSAN},
	}
	on, err := boolVar(get, "GRPC_SERVER_USE_TLS")
	if err != nil {
		return err
	}
	if !on {
		var unused []string
		for _, v := range vars {
			if _, ok := get(v.name); ok {
				unused = append(unused, v.name)
			}
		}
		if len(unused) > 0 {
			p.note(true, "no effect without GRPC_SERVER_USE_TLS=true (as in the reference): the gRPC listener is plaintext", unused...)
		}
		return nil
	}
	for _, v := range vars[:2] {
		if val, _ := get(v.name); val == "" && !p.explicit[groupGRPCTLS] {
			// The reference would start and fail every handshake.
			return fmt.Errorf("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY: %s is not set", v.name)
		}
	}
	for _, v := range vars {
		if val, ok := get(v.name); ok && val != "" {
			p.set(v.flag, val, v.name, groupGRPCTLS)
		}
	}
	return nil
}

func planMetrics(p *Plan, get func(string) (string, bool)) error {
	on, err := boolVar(get, "USE_PROMETHEUS")
	if err != nil {
		return err
	}
	if !on {
		if _, ok := get("PROMETHEUS_ADDR"); ok {
			p.note(false, "no effect without USE_PROMETHEUS=true; metrics are on the HTTP port's /metrics", "PROMETHEUS_ADDR")
		}
		return nil
	}
	addr, ok := get("PROMETHEUS_ADDR")
	if !ok {
		addr = defaultOf("PROMETHEUS_ADDR")
	}
	path, ok := get("PROMETHEUS_PATH")
	if !ok {
		path = defaultOf("PROMETHEUS_PATH")
	}
	p.set(FlagMetricsAddr, addr, "USE_PROMETHEUS/PROMETHEUS_ADDR", groupMetrics)
	p.set(FlagMetricsPath, path, "PROMETHEUS_PATH", groupMetrics)
	return nil
}

// planStatsd: the reference sends its stats to STATSD_HOST:STATSD_PORT
// unless USE_STATSD=false (true by default) or DISABLE_STATS=true.
func planStatsd(p *Plan, get func(string) (string, bool)) error {
	flags := map[string]bool{}
	for _, name := range []string{"USE_STATSD", "DISABLE_STATS", "USE_PROMETHEUS", "USE_DOG_STATSD"} {
		on, err := boolVar(get, name)
		if err != nil {
			return err
		}
		flags[name] = on
	}
	addr, _, err := hostPort(get, "STATSD_HOST", "STATSD_PORT")
	if err != nil {
		return err
	}
	_, useStatsdSet := get("USE_STATSD")
	switch {
	case !p.inUse || !flags["USE_STATSD"] || flags["DISABLE_STATS"]:
		return nil
	case !useStatsdSet && (flags["USE_PROMETHEUS"] || flags["USE_DOG_STATSD"]):
		p.note(true, "no statsd: USE_STATSD is unset (true) with another stats sink, which the reference refuses to start with; "+
			"set USE_STATSD=false, or true for statsd too", "USE_STATSD")
		return nil
	}
	if addr == "" {
		addr = net.JoinHostPort(defaultOf("STATSD_HOST"), defaultOf("STATSD_PORT"))
	}
	p.set(FlagStatsdAddr, addr, "USE_STATSD/STATSD_HOST/STATSD_PORT", "")
	return nil
}

func planMisc(p *Plan, get func(string) (string, bool)) error {
	if b, ok := get("BACKEND_TYPE"); ok && b != "redis" && b != "" {
		return fmt.Errorf("BACKEND_TYPE=%q: Redis is the only backend here", b)
	}
	return nil
}

// planDefaultAlgorithm: started as the reference is, the rules that name
// no algorithm count as the reference counts, on its keys, so that its
// replicas and these share their counters during a rolling swap.
func planDefaultAlgorithm(p *Plan, _ func(string) (string, bool)) error {
	if p.inUse {
		p.set(FlagDefaultAlgorithm, config.ReferenceFixedWindow.String(), "the reference's environment", "")
	}
	return nil
}

// planRedis turns REDIS_* into one of --redis-url, --redis-cluster-url and
// --redis-sentinel-url, and the TLS flags.
func planRedis(p *Plan, get func(string) (string, bool)) error {
	_, urlSet := get("REDIS_URL")
	if p.explicit[groupRedis] && len(p.redisGroup) > 0 {
		p.note(true, "ignored: a --redis-* flag or RATELIMIT_REDIS_* variable is set, and the Redis settings come from there alone", p.redisGroup...)
	}
	if !p.Redis || p.explicit[groupRedis] {
		return nil
	}
	if !urlSet {
		return errors.New("a REDIS_* variable is set but REDIS_URL is not: set REDIS_URL (or --redis-url), " +
			"or unset every REDIS_* to run on the embedded store (one replica, counting alone)")
	}
	r, err := redisFromEnv(get, "REDIS_")
	if err != nil {
		return err
	}
	if len(r.unused) > 0 {
		p.note(true, "no effect without REDIS_TYPE=SENTINEL", r.unused...)
	}
	flag := [...]string{FlagRedisURL, FlagRedisClusterURL, FlagRedisSentinelURL}[r.kind]
	p.set(flag, r.url, "REDIS_URL", groupRedis)
	perSecondTLS := false
	if on, err := boolVar(get, "REDIS_PERSECOND"); err == nil && on {
		perSecondTLS, _ = boolVar(get, "REDIS_PERSECOND_TLS") // planRedisPerSecond reports a bad value
	}
	return planRedisTLS(p, get, r.tls || perSecondTLS)
}

// planRedisPerSecond turns REDIS_PERSECOND=true and REDIS_PERSECOND_* into
// one of --redis-persecond-url, --redis-persecond-cluster-url and
// --redis-persecond-sentinel-url, read as REDIS_* are. The TLS files are
// REDIS_TLS_*, shared by both Redis as in the reference (planRedis).
func planRedisPerSecond(p *Plan, get func(string) (string, bool)) error {
	on, err := boolVar(get, "REDIS_PERSECOND")
	if err != nil {
		return err
	}
	var unused []string
	for _, name := range p.perSecondGroup {
		if name != "REDIS_PERSECOND" {
			unused = append(unused, name)
		}
	}
	switch {
	case !on:
		if len(unused) > 0 {
			p.note(true, "no effect without REDIS_PERSECOND=true (as in the reference)", unused...)
		}
		return nil
	case p.explicit[groupRedisPerSecond]:
		p.note(true, "ignored: a --redis-persecond-* flag or RATELIMIT_REDIS_PERSECOND_* variable is set, "+
			"and the per-second Redis comes from there alone", p.perSecondGroup...)
		return nil
	}
	if _, ok := get("REDIS_PERSECOND_URL"); !ok {
		return errors.New("REDIS_PERSECOND=true but REDIS_PERSECOND_URL is not set: set it (or --redis-persecond-url), " +
			"or unset REDIS_PERSECOND to count per-second limits on REDIS_URL's Redis")
	}
	r, err := redisFromEnv(get, "REDIS_PERSECOND_")
	if err != nil {
		return err
	}
	if len(r.unused) > 0 {
		p.note(true, "no effect without REDIS_PERSECOND_TYPE=SENTINEL", r.unused...)
	}
	flag := [...]string{FlagRedisPerSecondURL, FlagRedisPerSecondClusterURL, FlagRedisPerSecondSentinelURL}[r.kind]
	p.set(flag, r.url, "REDIS_PERSECOND_URL", groupRedisPerSecond)
	return nil
}

// redisKind is the form of a Redis the reference's *_TYPE names.
type redisKind int

const (
	redisSingle redisKind = iota
	redisCluster
	redisSentinel
)

// redisEnv is a Redis read from the reference's variables.
type redisEnv struct {
	kind redisKind
	url  string // go-redis's URL
	tls  bool   // <prefix>TLS=true
	// unused: SENTINEL_AUTH, set without TYPE=SENTINEL.
	unused []string
}

// redisFromEnv reads the variables prefix+URL, TYPE, SOCKET_TYPE, AUTH,
// TLS and SENTINEL_AUTH as the reference reads them (prefix REDIS_ or
// REDIS_PERSECOND_) into a go-redis URL.
func redisFromEnv(get func(string) (string, bool), prefix string) (redisEnv, error) {
	name := func(v string) string { return prefix + v }
	raw, _ := get(name("URL"))
	if raw == "" {
		return redisEnv{}, fmt.Errorf("%s is empty", name("URL"))
	}
	tlsOn, err := boolVar(get, name("TLS"))
	if err != nil {
		return redisEnv{}, err
	}
	socket, socketSet := get(name("SOCKET_TYPE"))
	socket = strings.ToLower(socket)
	if socketSet && socket != "tcp" && socket != "unix" {
		return redisEnv{}, fmt.Errorf("%s=%q: tcp or unix", name("SOCKET_TYPE"), socket)
	}
	typ, typeSet := get(name("TYPE"))
	if !typeSet {
		typ = defaultOf(name("TYPE"))
	}
	auth, _ := get(name("AUTH"))
	scheme := redisScheme(tlsOn)
	r := redisEnv{tls: tlsOn}
	switch strings.ToLower(typ) {
	case "single":
		r.url, err = singleURL(raw, socket, auth, tlsOn)
	case "cluster":
		r.kind = redisCluster
		r.url, err = listURL(strings.Split(raw, ","), scheme, auth, "")
	case "sentinel":
		r.kind = redisSentinel
		parts := strings.Split(raw, ",")
		if len(parts) < 2 || parts[0] == "" {
			return redisEnv{}, fmt.Errorf("%s: with %s=SENTINEL, the form is MASTER_NAME,host:port[,host:port...]", name("URL"), name("TYPE"))
		}
		sentinelAuth, _ := get(name("SENTINEL_AUTH"))
		r.url, err = listURL(parts[1:], scheme, sentinelAuth, parts[0])
		if err == nil && auth != "" {
			user, pass := splitAuth(auth)
			q := url.Values{}
			if user != "" {
				q.Set("username", user)
			}
			q.Set("password", pass)
			r.url += "&" + q.Encode()
		}
	default:
		return redisEnv{}, fmt.Errorf("%s=%q: SINGLE, CLUSTER or SENTINEL", name("TYPE"), typ)
	}
	if err != nil {
		return redisEnv{}, fmt.Errorf("%s: %w", name("URL"), err)
	}
	if _, ok := get(name("SENTINEL_AUTH")); ok && r.kind != redisSentinel {
		r.unused = append(r.unused, name("SENTINEL_AUTH"))
	}
	return r, nil
}

// planRedisTLS sets the Redis TLS flags from REDIS_TLS_*, which the
// reference reads when REDIS_TLS or REDIS_PERSECOND_TLS is true, for both
// of its Redis.
func planRedisTLS(p *Plan, get func(string) (string, bool), tlsOn bool) error {
	tlsVars := []struct{ name, flag string }{
		{"REDIS_TLS_CACERT", FlagRedisTLSCA}, {"REDIS_TLS_CLIENT_CERT", FlagRedisTLSCert}, {"REDIS_TLS_CLIENT_KEY", FlagRedisTLSKey},
	}
	var unused []string
	for _, v := range tlsVars {
		val, ok := get(v.name)
		switch {
		case !ok || val == "":
		case tlsOn:
			p.set(v.flag, val, v.name, groupRedis)
		default:
			unused = append(unused, v.name)
		}
	}
	skip, err := boolVar(get, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	if err != nil {
		return err
	}
	if skip && tlsOn {
		p.set(FlagRedisTLSSkipHostname, "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", groupRedis)
	} else if skip {
		unused = append(unused, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	}
	if len(unused) > 0 {
		p.note(true, "no effect without REDIS_TLS=true or REDIS_PERSECOND_TLS=true (as in the reference)", unused...)
	}
	return nil
}

func boolVar(get func(string) (string, bool), name string) (bool, error) {
	v, ok := get(name)
	if !ok {
		v = defaultOf(name)
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: %q is not true or false", name, v)
	}
	return b, nil
}

// Converters of single variables.

func convBool(v string) (string, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return "", fmt.Errorf("%q is not true or false", v)
	}
	return strconv.FormatBool(b), nil
}

func convDuration(v string) (string, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return "", fmt.Errorf("%q is not a duration like 30s", v)
	}
	return d.String(), nil
}

func convFloat(v string) (string, error) {
	if _, err := strconv.ParseFloat(v, 64); err != nil {
		return "", fmt.Errorf("%q is not a number", v)
	}
	return v, nil
}

// convLogLevel maps logrus's levels to zap's.
func convLogLevel(v string) (string, error) {
	switch l := strings.ToLower(v); l {
	case "trace", "debug":
		return "debug", nil
	case "info":
		return "info", nil
	case "warn", "warning":
		return "warn", nil
	case "error", "fatal", "panic":
		return "error", nil
	}
	return "", fmt.Errorf("%q is not a log level (trace, debug, info, warn, error)", v)
}

// convLogFormat: the reference writes JSON for "json" and text for anything else.
func convLogFormat(v string) (string, error) {
	if strings.EqualFold(v, "json") {
		return "json", nil
	}
	return "console", nil
}

// convLocalCache maps LOCAL_CACHE_SIZE_IN_BYTES: 0 turns the deny cache off;
// a size keeps its default.
func convLocalCache(v string) (string, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return "", fmt.Errorf("%q is not a size in bytes", v)
	}
	if n == 0 {
		return "0s", nil
	}
	return "", nil
}
