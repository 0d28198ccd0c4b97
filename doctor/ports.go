package doctor

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"

	"github.com/extract-dev/extract/sglang"
)

// checkStatusPort checks that status.listen can be listened on: a run that finds it
// taken refuses to start (exit 3), so doctor must not pass it.
func (d *doctor) checkStatusPort(context.Context) []Check {
	const name = "status port"
	listen := d.cfg.Status.Listen
	host, p, err := net.SplitHostPort(listen)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		return []Check{failCheck(name, "set status.listen to host:port (port 0 picks a free one)", "status.listen %q is not host:port", listen)}
	}
	if port == 0 {
		return []Check{okCheck(name, "%s: a free port is picked at start and recorded in run.json", listen)}
	}
	if d.running > 0 {
		if addr, ok := d.opt.Job.RunStatusAddr(d.running); ok {
			return []Check{okCheck(name, "%s is the running run's (pid %d, serving on %s)", listen, d.running, addr)}
		}
	}
	use, err := sglang.ProbePort(host, port)
	switch {
	case err != nil:
		return []Check{failCheck(name, "set status.listen to an address of this machine", "cannot listen on %s: %v", use.Addr, err)}
	case !use.InUse:
		return []Check{okCheck(name, "%s is free", use.Addr)}
	}
	fix, who := d.portTaken(use, "status.listen (port 0 picks a free one)")
	return []Check{failCheck(name, fix, "%s is taken by %s", use.Addr, who)}
}

// portTaken says who holds a port the job needs and what to do, key being the setting
// that moves it: a server of another shard of this job (shards on one node each need
// their own ports), a server some other extract launched, connections in TIME_WAIT
// (wait a minute), or a stranger.
func (d *doctor) portTaken(use sglang.PortUse, key string) (fix, who string) {
	who = use.Who()
	switch {
	case use.HolderPID > 0 && use.ServerID != "":
		if dir := d.shardOwning(use.HolderPID); dir != "" {
			return "give each shard or job on this node its own ports: set " + key + " per shard (e.g. EXTRACT_SERVER_PORT)",
				fmt.Sprintf("%s, the server of the job in %s (another shard of this job, or its unsharded run), which `extract stop` there stops", use.Holder, dir)
		}
		return "stop that job's run (`extract stop` with its config), or set " + key + " to a free port", who
	case use.HolderPID == 0 && use.TimeWait:
		return "run again in a minute, or set " + key + " to a free port", who
	}
	return "stop it, or set " + key + " to a free port", who
}

// shardOwning is the state dir of another shard of this job (or of its unsharded run)
// whose recorded server owns pid, or "".
func (d *doctor) shardOwning(pid int) string {
	base := d.cfg.StateDir
	if d.cfg.Shard.Count > 0 {
		base = filepath.Dir(base)
	}
	dirs, _ := filepath.Glob(filepath.Join(base, "shard-*-of-*"))
	for _, dir := range append([]string{base}, dirs...) {
		if dir == d.cfg.StateDir {
			continue
		}
		if id, err := sglang.LoadServerIdentity(dir, d.opt.Log); err == nil && id.Owns(pid) {
			return dir
		}
	}
	return ""
}
