package settings

import (
	"errors"
	"time"

	"github.com/slidingwindow/ratelimit/internal/regions"
)

// The flags of one limit across regions that code refers to.
const (
	FlagRegion                = "region"
	FlagRegions               = "regions"
	FlagLedgerRedisURL        = "ledger-redis-url"
	FlagLedgerRedisClusterURL = "ledger-redis-cluster-url"
	FlagLedgerRedisSentinel   = "ledger-redis-sentinel-url"
)

// regionSettings: one limit across regions (the config's global rules),
// each region on its own Redis, with a ledger every region reaches.
func regionSettings(s *Settings) []Setting {
	return []Setting{
		{Name: FlagRegion, bind: stringFlag(&s.Region, ""),
			Help: "this instance's region, for the config's global rules; needs a ledger",
			Doc: "this instance's region, for the config's `global` rules: its instances share the region's allowance of " +
				"each global limit on the region's own Redis (`--redis-*`). Needs a ledger " +
				"([regions.md](regions.md))",
			check: func() error {
				ledger := s.LedgerURL != "" || s.LedgerClusterURL != "" || s.LedgerSentinelURL != ""
				switch {
				case (s.Region == "") != !ledger:
					return errors.New("--region and a ledger (--ledger-redis-url, -cluster-url or -sentinel-url) go together")
				case ledger && s.Regions < 1:
					return errors.New("--regions: how many regions share the global limits, with a ledger")
				case s.LedgerURL != "" && s.LedgerClusterURL != "", s.LedgerURL != "" && s.LedgerSentinelURL != "",
					s.LedgerClusterURL != "" && s.LedgerSentinelURL != "":
					return errors.New("give one of --ledger-redis-url, --ledger-redis-cluster-url and --ledger-redis-sentinel-url")
				}
				return nil
			}},
		{Name: FlagRegions, bind: intFlag(&s.Regions, 0),
			Help: "how many regions share each global limit (every region's floor is reserved on the ledger)",
			Doc: "how many regions share each global limit, the same in every region: each keeps its `regional_share` of " +
				"the limit, reserved for it on the ledger whether it asks or not",
			check: func() error { return want(s.Regions >= 0, s.Regions, "a count of regions") }},
		{Name: FlagLedgerRedisURL, bind: stringFlag(&s.LedgerURL, ""),
			Help: "the ledger: a standalone Redis every region reaches, as --redis-url",
			Doc: "the ledger: a Redis every region reaches, where each global limit's allowances are leased to the " +
				"regions, in `--redis-url`'s forms (the `--redis-tls-*` files serve it too). Off the request path: a region " +
				"cut from it decides with what it holds ([regions.md](regions.md))"},
		{Name: FlagLedgerRedisClusterURL, bind: stringFlag(&s.LedgerClusterURL, ""),
			Help: "the ledger as a Redis Cluster, as --redis-cluster-url",
			Doc:  "the ledger as a Redis Cluster, as `--redis-cluster-url`"},
		{Name: FlagLedgerRedisSentinel, bind: stringFlag(&s.LedgerSentinelURL, ""),
			Help: "the ledger as a Sentinel-managed master, as --redis-sentinel-url",
			Doc:  "the ledger as a Sentinel-managed master, as `--redis-sentinel-url`"},
		{Name: "global-lease", bind: durationFlag(&s.GlobalLease, regions.DefaultLease),
			Help: "how long a region's grant of a global limit lives on the ledger; renewed at half of it",
			Doc: "how long a region's grant of a global limit lives on the ledger, renewed when half of it is left, in turns " +
				"of a quarter of it, each call to the ledger timing out with its turn: keep a quarter of it several round trips " +
				"to the ledger long (a new connection alone takes three or four). A region cut from the ledger decides " +
				"with its grant that long at most, then by the rule's `when_cut`",
			check: func() error { return want(s.GlobalLease >= 100*time.Millisecond, s.GlobalLease, "at least 100ms") }},
		{Name: "global-refresh", bind: durationFlag(&s.GlobalRefresh, regions.DefaultRefresh),
			Help: "how often an instance syncs each global key with its region's record",
			Doc: "how often an instance syncs each global key it sees with its region's record on the region's Redis: its " +
				"demand in, the region's grant out. At most a quarter of `--global-lease`",
			check: func() error {
				return want(s.GlobalRefresh >= time.Millisecond && s.GlobalRefresh <= s.GlobalLease/4, s.GlobalRefresh,
					"from 1ms to a quarter of --global-lease")
			}},
	}
}
