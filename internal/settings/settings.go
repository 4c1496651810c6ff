// Package settings declares the service's settings once, in one table
// (table, in table.go, made of one function per group of settings there and
// in table_conns.go): each setting's flag, its RATELIMIT_ environment variable,
// the variables of envoyproxy/ratelimit (the reference) that set it, its
// default, its check and its help. The flag set, the reading of the
// environment, the validation and the tables of docs/flags.md and
// docs/migration.md all come from that table.
package settings

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// Settings are the service's settings, typed, once parsed and validated.
type Settings struct {
	ConfigPath  string
	ConfigFiles string
	WatchConfig bool
	XDS         XDS

	GRPCAddr, HTTPAddr, AdminAddr, DebugAddr string
	MetricsAddr, MetricsPath                 string
	StatsdAddr, StatsdProtocol, StatsdTags   string
	StatsdFlushInterval                      time.Duration
	GRPCServer                               string
	GRPCMaxConnAge, GRPCMaxConnAgeGrace      time.Duration
	GRPCTLS                                  GRPCTLS

	RedisURL, RedisClusterURL, RedisSentinelURL string
	RedisTLS                                    RedisTLS
	KeyPrefix                                   string
	StoreTimeout, DenyCache                     time.Duration

	// The per-second Redis: empty, the limits of a one-second window are
	// counted on the main one.
	RedisPerSecondURL, RedisPerSecondClusterURL, RedisPerSecondSentinelURL string

	DefaultAlgorithm, DefaultFailureMode, RecordCosts string
	MergeDomainConfig                                 bool

	MaxDescriptors, MaxEntries, MaxRequestBytes, MaxInFlight, MaxConnections int
	RLQSReportInterval, RLQSLease                                            time.Duration
	HotKeyThreshold, HotKeyWarmThreshold                                     float64
	HotKeySlicePeriod                                                        time.Duration

	// One limit across regions: this instance's region, how many regions
	// share each global limit, and the ledger (empty: none).
	Region                                         string
	Regions                                        int
	LedgerURL, LedgerClusterURL, LedgerSentinelURL string
	GlobalLease, GlobalRefresh                     time.Duration
	MemoryLimit                                    ByteSize

	RateLimitHeaders                          bool
	LimitHeader, RemainingHeader, ResetHeader string
	ResponseDynamicMetadata, QuotaMode        bool
	ShadowMode                                bool
	NearLimitRatio                            float64

	ShutdownDelay, DrainTimeout time.Duration
	Tracing                     Tracing
	LogLevel, LogFormat         string
	Pprof                       bool

	// Reference is what the reference's environment asked for (env.go),
	// nil before Parse.
	Reference *Plan
	// redisFlagSet: a --redis-* flag was given, on the command line or as
	// RATELIMIT_REDIS_*.
	redisFlagSet bool
}

// The values of --config-type, the reference's CONFIG_TYPE.
const (
	ConfigTypeFile = "FILE"
	ConfigTypeXDS  = "GRPC_XDS_SOTW"
)

// The servers --grpc-server chooses from for the gRPC port.
const (
	// GRPCServerLean is internal/grpcunary, the default: it spends less CPU
	// per call than grpc-go's server (docs/bench.md).
	GRPCServerLean = "lean"
	// GRPCServerGRPCGo is grpc-go's own server, kept as an escape hatch
	// should the lean one misbehave with some client.
	GRPCServerGRPCGo = "grpc-go"
)

// XDS are the settings of config over xDS. Each stands for one of the
// reference's variables.
type XDS struct {
	ConfigType                     string
	ServerURL, NodeID              string
	NodeMetadata                   string // key=value,key2=value2: see NodeMetadataMap
	Headers                        string // key:value,key2:value2: see HeaderMap
	TLS                            bool
	TLSCert, TLSKey, TLSCA, TLSSAN string
	BackoffInitial, BackoffMax     time.Duration
	BackoffFactor                  float64
	BackoffJitter                  bool
	MaxMsgSize                     int
	ForceStart                     bool
}

// NodeMetadataMap is --xds-node-metadata parsed.
func (x *XDS) NodeMetadataMap() (map[string]string, error) {
	return keyValues("--"+FlagXDSNodeMetadata, x.NodeMetadata, "=")
}

// HeaderMap is --xds-headers parsed.
func (x *XDS) HeaderMap() (map[string]string, error) {
	return keyValues("--"+FlagXDSHeaders, x.Headers, ":")
}

// StatsdTagMap is --statsd-tags parsed.
func (s *Settings) StatsdTagMap() (map[string]string, error) {
	return keyValues("--"+FlagStatsdTags, s.StatsdTags, ":")
}

// keyValues parses "k1<sep>v1,k2<sep>v2"; empty gives none.
func keyValues(flagName, s, sep string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for entry := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(entry, sep)
		if k = strings.TrimSpace(k); !ok || k == "" {
			return nil, fmt.Errorf("%s: %q is not key%svalue", flagName, entry, sep)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

// GRPCTLS is the TLS of the gRPC listeners.
type GRPCTLS struct {
	Cert, Key, ClientCA, ClientSAN string
}

// RedisTLS is the TLS of the Redis client (rediss:// only).
type RedisTLS struct {
	CA, Cert, Key, ServerName string
	SkipHostnameVerification  bool
}

// Tracing is OpenTelemetry tracing of gRPC calls, with the reference's
// settings (TRACING_*).
type Tracing struct {
	Enabled                             bool
	ServiceName, ServiceNamespace       string
	ServiceInstanceID, ExporterProtocol string
	SamplingRate                        float64
}

// ConfigDefaults are the config parser's defaults the settings give.
func (s *Settings) ConfigDefaults() (config.Defaults, error) {
	alg, err := config.ParseAlgorithm(s.DefaultAlgorithm)
	if err != nil {
		return config.Defaults{}, fmt.Errorf("--%s: %w", FlagDefaultAlgorithm, err)
	}
	fm := config.FailureDefer
	if s.DefaultFailureMode != "" {
		if fm, err = config.ParseFailureMode(s.DefaultFailureMode); err != nil {
			return config.Defaults{}, fmt.Errorf("--%s: %w, or empty to defer to Envoy", FlagDefaultFailureMode, err)
		}
	}
	rc, err := config.ParseCostRecording(s.RecordCosts)
	if err != nil {
		return config.Defaults{}, fmt.Errorf("--%s: %w", FlagRecordCosts, err)
	}
	files, err := config.ParseFileSet(s.ConfigFiles)
	if err != nil {
		return config.Defaults{}, fmt.Errorf("--%s: %w", FlagConfigFiles, err)
	}
	var regions int
	if s.Region != "" {
		regions = s.Regions
	}
	return config.Defaults{Algorithm: alg, FailureMode: fm, RecordCosts: rc, MergeDomains: s.MergeDomainConfig, Files: files, Regions: regions}, nil
}

// RedisSettingGiven reports a Redis setting: a --redis-* flag or
// RATELIMIT_REDIS_* variable, or one of the reference's REDIS_* variables.
func (s *Settings) RedisSettingGiven() bool {
	return s.redisFlagSet || s.Reference != nil && s.Reference.Redis
}

// ByteSize is a number of bytes written as GOMEMLIMIT is: an integer with
// an optional unit B, KiB, MiB, GiB or TiB. It is a flag.Value.
type ByteSize int64

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

func (b *ByteSize) String() string {
	for _, u := range byteUnits {
		if n := int64(*b); n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return "0"
}

// Set parses v.
func (b *ByteSize) Set(v string) error {
	num, shift := v, uint(0)
	for _, u := range byteUnits {
		if s, ok := strings.CutSuffix(v, u.suffix); ok {
			num, shift = s, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)>>shift {
		return fmt.Errorf("%q is not a size like 200MiB", v)
	}
	*b = ByteSize(n << shift)
	return nil
}

// DefaultMemoryLimit is --memory-limit's default: below the central
// manifest's 256 MiB container limit, with room for what the Go runtime
// does not count (stacks in use are counted; the binary and its mappings
// are not).
const DefaultMemoryLimit = 200 << 20
