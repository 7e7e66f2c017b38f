"""Optional TLS on the gateway (`--tls-cert PATH --tls-key PATH`, flowrt.frontdoor): a real
`flowc run --http` server on loopback serves https with a self-signed certificate made here
(the `cryptography` package where installed, else the `openssl` command), which the official
openai client and http.client trust by that certificate alone; plain http to the same port gets
no answer; a half-given pair, an unreadable file or a key that is not the certificate's is
refused with one line naming the option, by both command lines, never a traceback."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from flowrt.frontdoor import front_door
from tests.gateway import guarded
from tests.runtime.test_serve import Server, serving

KEY = "tls-key-0123456789abcdef"


def self_signed(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost and its private key, PEM: (cert, key)."""
    cert, key = directory / f"{name}-cert.pem", directory / f"{name}-key.pem"
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("making a test certificate needs the `cryptography` package or the `openssl` command")
        made = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
            + ["-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"]
            + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        return cert, key
    import ipaddress

    private = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    names = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    made = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(names, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(made.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert, key


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return guarded.bundle(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("certs"))


def test_the_gateway_serves_https_and_nothing_in_plain_http(bundle: Path, pair: tuple[Path, Path]):
    cert, key = pair
    options = ["--tls-cert", str(cert), "--tls-key", str(key), "--api-key", KEY, "--grace", "0"]
    with serving(bundle, guarded.command(bundle, *options)) as server:
        trusting = ssl.create_default_context(cafile=str(cert))
        connection = http.client.HTTPSConnection(server.host, server.port, timeout=30, context=trusting)
        connection.request("GET", "/health")
        answer = connection.getresponse()
        assert answer.status == 200 and "talk" in json.loads(answer.read())["graphs"]
        connection.close()
        with openai.DefaultHttpxClient(verify=trusting, timeout=30) as transport:  # (openai's own httpx client)
            client = openai.OpenAI(
                base_url=f"https://{server.host}:{server.port}/v1", api_key=KEY, max_retries=0, http_client=transport
            )
            reply = client.chat.completions.create(model="talk", messages=[{"role": "user", "content": "over tls"}])
            assert reply.choices[0].message.content == "over tls "
            with pytest.raises(openai.AuthenticationError):  # the keys still hold, inside TLS
                client.with_options(api_key="wrong-key-0123456789").models.list()
        untrusting = ssl.create_default_context()  # the system's authorities do not know a self-signed certificate
        with pytest.raises(ssl.SSLCertVerificationError):
            refused = http.client.HTTPSConnection(server.host, server.port, timeout=30, context=untrusting)
            refused.request("GET", "/health")
        plain(server)
        top = subprocess.run(  # flowc top reads an https server its system trusts (here: SSL_CERT_FILE), with the key
            [sys.executable, "-m", "flowc", "top", f"https://{server.host}:{server.port}", "--once", "--api-key", KEY],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "SSL_CERT_FILE": str(cert)},
        )
        assert top.returncode == 0 and f"at https://{server.host}:{server.port}" in top.stdout, top.stderr


def plain(server: Server) -> None:
    """Plain http to the TLS port gets no HTTP answer (the server reads no request from it)."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        connection.request("GET", "/health")
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            connection.getresponse()
    finally:
        connection.close()


def test_options_that_cannot_make_tls_are_refused_naming_the_option(tmp_path: Path, pair: tuple[Path, Path]):
    cert, key = pair
    other_cert, other_key = self_signed(tmp_path, "other")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        ({"tls_cert": str(cert)}, "--tls-cert needs --tls-key too"),
        ({"tls_key": str(key)}, "--tls-key needs --tls-cert too"),
        ({"tls_cert": str(tmp_path / "missing.pem"), "tls_key": str(key)}, "--tls-cert: cannot read"),
        ({"tls_cert": str(cert), "tls_key": str(tmp_path)}, "--tls-key: cannot read"),
        ({"tls_cert": str(cert), "tls_key": str(other_key)}, "are not a PEM certificate chain and its private key"),
        ({"tls_cert": str(garbage), "tls_key": str(key)}, "are not a PEM certificate chain and its private key"),
    ]
    for given, words in cases:
        with pytest.raises(ValueError, match=words):
            front_door(given, {})
    assert front_door({"tls_cert": str(other_cert), "tls_key": str(other_key)}, {}).tls is not None
    encrypted = tmp_path / "encrypted-key.pem"
    if shutil.which("openssl") is not None:
        made = subprocess.run(
            ["openssl", "pkey", "-in", str(key), "-out", str(encrypted), "-aes256", "-passout", "pass:secret-words"],
            capture_output=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        with pytest.raises(ValueError, match="--tls-key: .* is encrypted; give an unencrypted key"):
            front_door({"tls_cert": str(cert), "tls_key": str(encrypted)}, {})


def test_both_command_lines_refuse_a_half_pair_without_a_traceback(bundle: Path, pair: tuple[Path, Path]):
    cert, _ = pair
    run = subprocess.run(
        guarded.command(bundle, "--tls-cert", str(cert)), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert run.returncode == 2 and "flowc: --tls-cert needs --tls-key too" in run.stderr, run.stderr
    bundled = subprocess.run(
        [sys.executable, "-m", bundle.name, "serve", "--http", "127.0.0.1:0", "--tls-key", str(cert.parent / "nope.pem")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=bundle.parent,
    )
    assert bundled.returncode == 2 and "--tls-key needs --tls-cert too" in bundled.stderr, bundled.stderr
    assert "Traceback" not in run.stderr + bundled.stderr


def test_a_tls_handshake_that_never_ends_is_closed_after_the_header_timeout(bundle: Path, pair: tuple[Path, Path]):
    """Slowloris on the handshake (found by a security trial: asyncio's default held such a
    connection 60 s whatever --header-timeout said): nothing sent, or a ClientHello begun and
    never finished, is closed like a header that never ends."""
    import socket

    from tests.gateway.test_admission import read_until_closed

    cert, key = pair
    options = ["--tls-cert", str(cert), "--tls-key", str(key), "--header-timeout", "1", "--grace", "0"]
    with serving(bundle, guarded.command(bundle, *options)) as server:
        silent = socket.create_connection((server.host, server.port), timeout=10)
        begun = socket.create_connection((server.host, server.port), timeout=10)
        begun.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a record header and the hello's start
        for connection in (silent, begun):
            assert read_until_closed(connection, 30) == b""  # (60 s without the limit)
            connection.close()
        trusting = ssl.create_default_context(cafile=str(cert))
        connection = http.client.HTTPSConnection(server.host, server.port, timeout=30, context=trusting)
        connection.request("GET", "/health")
        assert connection.getresponse().status == 200  # still serving
        connection.close()
