package orchestrator

// poison is the poison rule's memory: the server deaths (and hangs) each sample was in
// flight at, in this run, and the samples sent alone since (died).
type poison struct {
	isolateAfter int // server.isolate_after_deaths, at least 1
	deaths       map[int]int
	alone        map[int]bool
}

// died counts a server death or hang with sample in flight: not the sample's fault as a
// rule (a death requeues without spending an attempt), but a prompt that kills the server
// would otherwise be retried forever. After isolateAfter deaths the sample is sent alone;
// the next death with it alone is its failure, which died reports.
func (p *poison) died(sample int, wasAlone bool) (fail bool) {
	if wasAlone {
		return true
	}
	if p.deaths == nil {
		p.deaths, p.alone = map[int]int{}, map[int]bool{}
	}
	p.deaths[sample]++
	if p.deaths[sample] >= max(p.isolateAfter, 1) {
		p.alone[sample] = true
	}
	return false
}

// isAlone says sample goes alone to a replica with nothing else in flight.
func (p *poison) isAlone(sample int) bool { return p != nil && p.alone[sample] }

func (p *poison) deathsOf(sample int) int {
	if p == nil {
		return 0
	}
	return p.deaths[sample]
}
