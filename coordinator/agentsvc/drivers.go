package agentsvc

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// Driver health: an agent announces its drivers with their health in its
// Hello and again in a DriverReport whenever one starts, fails, appears or
// goes. Operations for a driver are routed only to agents that offer it;
// when none does, the NoAgentError says why on each agent that has the
// driver but does not offer it (its plugin failing to start, with the
// exit status and last stderr lines the agent reported).

// DriverHealth is one driver on an agent, as the agent last reported it.
type DriverHealth struct {
	Name, Version string
	// Health is "ok", "starting", "restarting", "failing" or
	// "not_executable"; Offered says the agent takes its operations.
	Health  string
	Offered bool
	// Detail says what is wrong when Health is not ok.
	Detail string
	// Source is "builtin" or the plugin file's path on the agent.
	Source    string
	Restarts  int
	NextStart time.Time
}

// maxDriverReport bounds what an agent's report is kept of.
const (
	maxDrivers      = 256
	maxDriverDetail = 2048
	maxWarnings     = 64
)

func driverHealth(ds []*agentpb.Driver) []DriverHealth {
	var out []DriverHealth
	for _, d := range ds {
		if len(out) == maxDrivers {
			break
		}
		h := DriverHealth{Name: d.Name, Version: d.Version, Health: d.Health, Offered: d.Offered || d.Health == "",
			Detail: clip(d.Detail, maxDriverDetail), Source: clip(d.Source, 512), Restarts: int(d.Restarts)}
		if h.Health == "" {
			h.Health = "ok" // an agent that reports no health offers every driver it names
		}
		if d.NextStartUnixNano != 0 {
			h.NextStart = time.Unix(0, d.NextStartUnixNano)
		}
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b DriverHealth) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func offeredNames(hs []DriverHealth) []string {
	var out []string
	for _, h := range hs {
		if h.Offered {
			out = append(out, h.Name)
		}
	}
	return out
}

func clipAll(ws []string) []string {
	var out []string
	for _, w := range ws {
		if len(out) == maxWarnings {
			break
		}
		out = append(out, clip(w, 1024))
	}
	return out
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// setDrivers replaces c's drivers from a DriverReport and wakes waiting
// dispatches; it logs drivers that stop or start being offered.
func (s *Service) setDrivers(c *conn, r *agentpb.DriverReport) {
	hs := driverHealth(r.Drivers)
	c.mu.Lock()
	before := c.drivers
	c.driverHealth, c.drivers, c.warnings = hs, offeredNames(hs), clipAll(r.PluginWarnings)
	c.mu.Unlock()
	for _, h := range hs {
		was := slices.Contains(before, h.Name)
		switch {
		case was && !h.Offered:
			s.logger.Warn("agent stopped offering a driver", "agent", c.id, "driver", h.Name, "health", h.Health, "detail", h.Detail)
		case !was && h.Offered:
			s.logger.Info("agent offers a driver", "agent", c.id, "driver", h.Name, "version", h.Version)
		}
	}
	s.mu.Lock()
	s.notifyLocked()
	s.mu.Unlock()
}

// offers reports whether c offers driver.
func (c *conn) offers(driver string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.drivers, driver)
}

// driverTrouble says, for each connected agent of site that has driver
// but does not offer it, why.
func (s *Service) driverTrouble(site, driver string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.conns {
		if !slices.Contains(c.sites, site) {
			continue
		}
		c.mu.Lock()
		for _, h := range c.driverHealth {
			if h.Name == driver && !h.Offered {
				why := fmt.Sprintf("agent %s has driver %s but it is %s", c.id, driver, h.Health)
				if h.Detail != "" {
					why += ": " + h.Detail
				}
				out = append(out, why)
			}
		}
		c.mu.Unlock()
	}
	slices.Sort(out)
	return out
}
