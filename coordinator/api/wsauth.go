package api

// A browser cannot set headers on a WebSocket handshake, so a native
// console WebSocket may carry its bearer token in Sec-WebSocket-Protocol
// instead of the Authorization header: the client offers two subprotocols,
// ConsoleSubprotocol and TokenSubprotocolPrefix followed by the token in
// unpadded base64url (RFC 4648 section 5). The server takes the token only
// from a WebSocket handshake that has no Authorization header, compares it
// in constant time like a header token, and answers with
// ConsoleSubprotocol alone: the token is never echoed.
const (
	// ConsoleSubprotocol is the console WebSocket's subprotocol: binary
	// messages from the server are console output, messages from the
	// client are typed into the console.
	ConsoleSubprotocol = "obmesh.console.v1"
	// TokenSubprotocolPrefix prefixes the base64url bearer token offered
	// as a subprotocol.
	TokenSubprotocolPrefix = "obmesh.bearer."
)
