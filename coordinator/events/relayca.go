package events

// relayCA is the CA certificate (PEM) the relay of agent announced, for a
// BMC that can verify the relay's certificate; nil when the agent is not
// connected or offers none (the BMC then delivers without verifying).
func (run *nodeRun) relayCA(agent string) []byte {
	for _, a := range run.r.cfg.Agents() {
		if a.ID == agent {
			return a.RelayCAPEM
		}
	}
	return nil
}
