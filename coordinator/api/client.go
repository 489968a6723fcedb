package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to a coordinator's native API. The zero value is not usable;
// create it with NewClient.
type Client struct {
	base  string
	token string
	http  *http.Client
	opts  CallOptions // see With
}

// NewClient returns a client for addr ("host:port" or a URL) authenticating
// with token. httpClient nil means a client with a 60s timeout.
func NewClient(addr, token string, httpClient *http.Client) *Client {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 60 * time.Second}
	}
	return &Client{base: strings.TrimRight(addr, "/"), token: token, http: httpClient}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	return c.doHeader(ctx, method, path, nil, in, out)
}

func (c *Client) doHeader(ctx context.Context, method, path string, hdr http.Header, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("obmesh API %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("obmesh API: read response: %w", err)
	}
	if resp.StatusCode >= 300 {
		var eb ErrorBody
		if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
			return &Error{StatusCode: resp.StatusCode, Code: CodeInternal, Message: strings.TrimSpace(string(raw))}
		}
		return &Error{StatusCode: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, Receipt: eb.Receipt}
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("obmesh API: decode response: %w", err)
		}
	}
	return nil
}

func nodePath(name string, rest ...string) string {
	return "/v1/nodes/" + url.PathEscape(name) + strings.Join(rest, "")
}

// RegisterNode registers a node.
func (c *Client) RegisterNode(ctx context.Context, s NodeSpec) (Node, error) {
	var n Node
	err := c.do(ctx, http.MethodPost, "/v1/nodes", s, &n)
	return n, err
}

// Nodes lists nodes.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var ns []Node
	err := c.do(ctx, http.MethodGet, "/v1/nodes", nil, &ns)
	return ns, err
}

// Node shows one node.
func (c *Client) Node(ctx context.Context, name string) (Node, error) {
	var n Node
	err := c.do(ctx, http.MethodGet, nodePath(name), nil, &n)
	return n, err
}

// DeleteNode deletes a node.
func (c *Client) DeleteNode(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, nodePath(name), nil, nil)
}

// Power carries out a power action.
func (c *Client) Power(ctx context.Context, name, action string) (Receipt, error) {
	var r Receipt
	err := c.doOp(ctx, http.MethodPost, nodePath(name, "/power"), PowerRequest{Action: action}, &r)
	return r, err
}

// PowerWithTimeout is Power with an operation timeout (a Go duration such as
// "10s") instead of the coordinator's default.
func (c *Client) PowerWithTimeout(ctx context.Context, name, action, timeout string) (Receipt, error) {
	var r Receipt
	err := c.do(ctx, http.MethodPost, nodePath(name, "/power")+"?timeout="+url.QueryEscape(timeout), PowerRequest{Action: action}, &r)
	return r, err
}

// PowerStatus reads the power state; the receipt's State holds it.
func (c *Client) PowerStatus(ctx context.Context, name string) (Receipt, error) {
	var r Receipt
	err := c.doOp(ctx, http.MethodGet, nodePath(name, "/power"), nil, &r)
	return r, err
}

// Identity reads the BMC's identity; the receipt's Identity holds it.
func (c *Client) Identity(ctx context.Context, name string) (Receipt, error) {
	var r Receipt
	err := c.doOp(ctx, http.MethodGet, nodePath(name, "/identity"), nil, &r)
	return r, err
}

// SetBootDevice sets the boot device.
func (c *Client) SetBootDevice(ctx context.Context, name string, b BootRequest) (Receipt, error) {
	var r Receipt
	err := c.doOp(ctx, http.MethodPut, nodePath(name, "/boot"), b, &r)
	return r, err
}

// Operation looks up a recent operation's receipt by id.
func (c *Client) Operation(ctx context.Context, id string) (Receipt, error) {
	var r Receipt
	err := c.do(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(id), nil, &r)
	return r, err
}

// Agents lists agents.
func (c *Client) Agents(ctx context.Context) ([]Agent, error) {
	var as []Agent
	err := c.do(ctx, http.MethodGet, "/v1/agents", nil, &as)
	return as, err
}

// Status describes the coordinator.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, &s)
	return s, err
}

// Peers lists the coordinator group with health.
func (c *Client) Peers(ctx context.Context) ([]Peer, error) {
	var ps []Peer
	err := c.do(ctx, http.MethodGet, "/v1/operator/raft/peers", nil, &ps)
	return ps, err
}

// AddPeer adds a voting member (its Raft address).
func (c *Client) AddPeer(ctx context.Context, id, address string) error {
	return c.do(ctx, http.MethodPost, "/v1/operator/raft/peers", PeerRequest{ID: id, Address: address}, nil)
}

// RemovePeer removes a member.
func (c *Client) RemovePeer(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/operator/raft/peers/"+url.PathEscape(id), nil, nil)
}

// SnapshotSave writes the replicated state (linearizable) to w.
func (c *Client) SnapshotSave(ctx context.Context, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/operator/snapshot", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("obmesh API %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var eb ErrorBody
		if json.Unmarshal(raw, &eb) == nil && eb.Error.Code != "" {
			return &Error{StatusCode: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
		}
		return &Error{StatusCode: resp.StatusCode, Code: CodeInternal, Message: string(raw)}
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// SnapshotRestore replaces nodes, sites and agents with a saved snapshot.
func (c *Client) SnapshotRestore(ctx context.Context, snapshot []byte) error {
	return c.do(ctx, http.MethodPost, "/v1/operator/snapshot", json.RawMessage(snapshot), nil)
}
