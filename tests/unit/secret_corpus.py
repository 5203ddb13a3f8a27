"""Corpora for tests/unit/test_secrets.py.

SECRET_CASES: synthetic credentials, realistically formatted, generated at import from a
seeded RNG (so no credential-looking literal sits in the source for scanners to trip on;
none of them is real). BENIGN_PAYLOADS: realistic payloads that must be accepted.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import uuid
from dataclasses import dataclass

_rng = random.Random(20240501)
_LOWER, _UPPER, _DIGITS = string.ascii_lowercase, string.ascii_uppercase, string.digits
_ALNUM = _LOWER + _UPPER + _DIGITS
_HEX = "0123456789abcdef"


def _r(n: int, alphabet: str = _ALNUM) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _b64url(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


def _jwt() -> str:
    header = _b64url({"alg": "HS256", "typ": "JWT"})
    claims = _b64url({"sub": _r(8, _DIGITS), "name": "Jane Doe", "iat": 1716200000})
    return f"{header}.{claims}.{_b64url(_r(24)).replace('=', '')}"


def _pem(kind: str) -> str:
    body = "\n".join(_b64(_rng.randbytes(48)) for _ in range(6))
    return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----\n"


@dataclass(frozen=True)
class SecretCase:
    kind: str
    payload: dict[str, object]
    path: str
    detector: str
    secret: str  # the value that must never appear in an error message


def _case(
    kind: str, detector: str, secret: str, where: str = "note", fmt: str = "{}"
) -> SecretCase:
    """Place `secret` (formatted into `fmt`) at $.order.<where> next to benign fields."""
    payload: dict[str, object] = {
        "order_id": f"ORD-2024-{_r(6, _DIGITS)}",
        "order": {"currency": "EUR", "amount": "129.90", where: fmt.format(secret)},
    }
    return SecretCase(kind, payload, f"$.order.{where}", detector, secret)


def _key_case(kind: str, payload: dict[str, object], path: str, secret: str) -> SecretCase:
    return SecretCase(kind, payload, path, "key_name", secret)


def _secret_cases() -> list[SecretCase]:
    pw, api, whk = "Sup3r-" + _r(10), "k-" + _r(12), "whk-55-" + _r(8)
    cases = [
        # --- key names (case-insensitive, across separators and camelCase)
        _key_case(
            "key_name:password", {"user": {"login": "jdoe", "password": pw}}, "$.user.password", pw
        ),
        _key_case(
            "key_name:password",
            {"form": {"newPassword": pw, "remember": True}},
            "$.form.newPassword",
            pw,
        ),
        _key_case("key_name:password", {"db": {"PASSWD": "hunter2!"}}, "$.db.PASSWD", "hunter2!"),
        _key_case(
            "key_name:password",
            {"pin_login": {"password": 482913}},
            "$.pin_login.password",
            "482913",
        ),
        _key_case(
            "key_name:api_key", {"headers": {"X-API-KEY": api}}, '$.headers["X-API-KEY"]', api
        ),
        _key_case(
            "key_name:api_key", {"cfg": [{"apiKey": "abc123def"}]}, "$.cfg[0].apiKey", "abc123def"
        ),
        _key_case("key_name:api_key", {"x_api_key": "plainkey42"}, "$.x_api_key", "plainkey42"),
        _key_case("key_name:api_key", {"APIKEY": "foo-bar-77"}, "$.APIKEY", "foo-bar-77"),
        _key_case(
            "key_name:client_secret",
            {"oauth": {"client_id": "app-17", "clientSecret": "s3cr3t-v"}},
            "$.oauth.clientSecret",
            "s3cr3t-v",
        ),
        _key_case(
            "key_name:token",
            {"auth": {"access_token": "at-1234-xyz"}},
            "$.auth.access_token",
            "at-1234-xyz",
        ),
        _key_case(
            "key_name:token",
            {"session": {"refreshToken": "rt.0099.ab"}},
            "$.session.refreshToken",
            "rt.0099.ab",
        ),
        _key_case(
            "key_name:credentials",
            {"credentials": {"user": "svc", "pass": "p4ss-w0rd"}},
            "$.credentials",
            "p4ss-w0rd",
        ),
        _key_case(
            "key_name:private_key",
            {"sa": {"private_key_id": "a" * 40, "private_key": "MIIEvQ-x"}},
            "$.sa.private_key",
            "MIIEvQ-x",
        ),
        _key_case(
            "key_name:cookie",
            {"headers": {"Cookie": "sid=8f7a6b5c4d"}},
            "$.headers.Cookie",
            "8f7a6b5c4d",
        ),
        _key_case(
            "key_name:cookie", {"session_cookie": "JSESSIONID=ab12"}, "$.session_cookie", "ab12"
        ),
        _key_case(
            "key_name:authorization",
            {"headers": {"Authorization": "Token abc123"}},
            "$.headers.Authorization",
            "abc123",
        ),
        _key_case(
            "key_name:secret", {"webhook": {"signing_secret": whk}}, "$.webhook.signing_secret", whk
        ),
        _key_case(
            "key_name:access_key",
            {"aws": {"secret_access_key": "notbase64butsecret/1"}},
            "$.aws.secret_access_key",
            "notbase64butsecret/1",
        ),
    ]
    aws_id = "AKIA" + _r(16, _UPPER + _DIGITS)
    sts_id = "ASIA" + _r(16, _UPPER + _DIGITS)
    aws_secret = _r(40, _ALNUM + "+/")
    az_key = _b64(_rng.randbytes(64))
    sg = f"SG.{_r(22, _ALNUM + '-_')}.{_r(43, _ALNUM + '-_')}"
    basic = _b64(f"svc-backup:{_r(12)}".encode())
    sa_json = json.dumps(
        {
            "type": "service_account",
            "project_id": "acme-prod-4711",
            "private_key": _pem("PRIVATE KEY"),
            "client_email": "x@acme.iam",
        }
    )
    cases += [
        _case(
            "bearer_token",
            "bearer_token",
            _r(40, _ALNUM + "-._"),
            fmt="curl -H 'Authorization: Bearer {}'",
        ),
        _case("bearer_token", "bearer_token", _r(24), fmt="header was bearer {} (expired?)"),
        _case("private_key", "private_key", _pem("RSA PRIVATE KEY"), where="pem"),
        _case("private_key", "private_key", _pem("EC PRIVATE KEY"), where="pem"),
        _case("private_key", "private_key", _pem("OPENSSH PRIVATE KEY"), where="pem"),
        _case("private_key", "private_key", _pem("ENCRYPTED PRIVATE KEY"), where="pem"),
        _case("jwt", "jwt", _jwt(), where="id_tok"),
        _case("jwt", "jwt", _jwt(), fmt="Session: {} (from the browser)"),
        _case("aws_access_key", "aws_access_key", aws_id, fmt="key id {} in us-east-1"),
        _case("aws_access_key", "aws_access_key", sts_id),
        _case("gcp_service_account", "private_key", sa_json, where="sa_json"),
        _case(
            "gcp_api_key",
            "gcp_api_key",
            "AIza" + _r(35, _ALNUM + "-_"),
            fmt="https://maps.googleapis.com/maps/api/geocode/json?address=x&key={}",
        ),
        _case("gcp_oauth", "gcp_oauth", "ya29." + _r(60, _ALNUM + "-_")),
        _case("gcp_oauth", "gcp_oauth", "GOCSPX-" + _r(28, _ALNUM + "-_")),
        _case("stripe_key", "stripe_key", "sk_live_" + _r(24)),
        _case("stripe_key", "stripe_key", "rk_live_" + _r(99)),
        _case("stripe_key", "stripe_key", "sk_test_" + _r(24)),
        _case("stripe_key", "stripe_key", "whsec_" + _r(32)),
        _case("github_token", "github_token", "ghp_" + _r(36)),
        _case("github_token", "github_token", "gho_" + _r(36), fmt="token={}"),
        _case("github_token", "github_token", "github_pat_" + _r(22) + "_" + _r(59)),
        _case("gitlab_token", "gitlab_token", "glpat-" + _r(20, _ALNUM + "-_")),
        _case("slack_token", "slack_token", f"xoxb-{_r(12, _DIGITS)}-{_r(13, _DIGITS)}-{_r(24)}"),
        _case(
            "slack_token", "slack_token", f"xoxp-{_r(11, _DIGITS)}-{_r(12, _DIGITS)}-{_r(32, _HEX)}"
        ),
        _case(
            "slack_token",
            "slack_token",
            f"xapp-1-A{_r(10, _UPPER + _DIGITS)}-{_r(13, _DIGITS)}-{_r(64, _HEX)}",
        ),
        _case(
            "slack_webhook",
            "slack_webhook",
            "https://hooks.slack.com/services/"
            f"T{_r(8, _UPPER + _DIGITS)}/B{_r(10, _UPPER + _DIGITS)}/{_r(24)}",
        ),
        _case("twilio_key", "twilio_key", "SK" + _r(32, _HEX)),
        _case("twilio_key", "twilio_key", "AC" + _r(32, _HEX), fmt="account {} / auth pending"),
        _case("sendgrid_key", "sendgrid_key", sg),
        _case(
            "azure_storage_key",
            "azure_storage_key",
            az_key,
            where="conn",
            fmt="DefaultEndpointsProtocol=https;AccountName=acmeprod;AccountKey={};"
            "EndpointSuffix=core.windows.net",
        ),
        _case(
            "azure_sas",
            "azure_sas",
            _b64(_rng.randbytes(32)).replace("+", "%2B"),
            fmt="https://acme.blob.core.windows.net/c/f.pdf?sv=2022-11-02&sp=r&sig={}",
        ),
        _case("npm_token", "npm_token", "npm_" + _r(36)),
        _case(
            "npm_token",
            "npm_token",
            str(uuid.UUID(int=_rng.getrandbits(128))),
            where="npmrc",
            fmt="//registry.npmjs.org/:_authToken={}",
        ),
        _case("basic_auth_header", "basic_auth_header", basic, fmt="Authorization: Basic {}"),
        _case(
            "basic_auth_url",
            "basic_auth_url",
            "Pg-" + _r(10),
            fmt="postgres://app_user:{}@db.internal:5432/orders",
        ),
        _case(
            "basic_auth_url", "basic_auth_url", "tr0ub4dor", fmt="https://admin:{}@ftp.example.org/"
        ),
        _case("openai_key", "openai_key", "sk-proj-" + _r(48, _ALNUM + "-_") + "T3BlbkFJ" + _r(20)),
        _case("openai_key", "openai_key", "sk-" + _r(20) + "T3BlbkFJ" + _r(20)),
        _case("anthropic_key", "anthropic_key", "sk-ant-api03-" + _r(93, _ALNUM + "-_") + "AA"),
        _case("pypi_token", "pypi_token", "pypi-AgEIcHlwaS5vcmc" + _r(80, _ALNUM + "-_")),
        _case("discord_token", "discord_token", f"M{_r(23)}.{_r(6)}.{_r(27)}"),
        _case(
            "discord_webhook",
            "discord_webhook",
            _r(68, _ALNUM + "-_"),
            fmt="https://discord.com/api/webhooks/1234567890123456789/{}",
        ),
        _case("telegram_token", "telegram_token", f"{_r(10, _DIGITS)}:{_r(35, _ALNUM + '-_')}"),
        _case("mailchimp_key", "mailchimp_key", f"{_r(32, _HEX)}-us14"),
        _case("square_oauth", "square_oauth", "sq0csp-" + _r(43, _ALNUM + "-_")),
        _case("huggingface_token", "huggingface_token", "hf_" + _r(34, _LOWER + _UPPER)),
        _case(
            "inline_credential",
            "inline_credential",
            "Pa55w0rd!" + _r(4),
            where="conn",
            fmt="Server=sql01;Database=orders;User Id=app;Password={};",
        ),
        _case(
            "inline_credential",
            "inline_credential",
            "h7Tq-" + _r(6),
            fmt="Customer wrote: my password: {} - please fix my account",
        ),
        _case(
            "inline_credential",
            "inline_credential",
            _r(12),
            fmt="https://api.example.com/v1/export?format=csv&access_token={}",
        ),
        _case("high_entropy", "high_entropy", aws_secret, fmt="secret is {} keep safe"),
        _case("high_entropy", "high_entropy", _r(64, _ALNUM + "-_"), where="opaque"),
        _case("high_entropy", "high_entropy", _b64(_rng.randbytes(48)), where="blob"),
    ]
    return cases


SECRET_CASES: list[SecretCase] = _secret_cases()


# ---------------------------------------------------------------------------- benign

_FIRST = [
    "Anna",
    "Jürgen",
    "Zoë",
    "Søren",
    "María José",
    "Hiroshi",
    "李娜",
    "Олег",
    "Fatima",
    "Noah",
    "Chloé",
    "Oluwaseun",
    "Ngozi",
    "Björn",
    "Aarav",
    "Émilie",
    "Łukasz",
    "Ana",
    "Mehmet",
    "Kai",
]
_LAST = [
    "Müller",
    "O'Brien",
    "Nguyễn",
    "García Márquez",
    "Tanaka",
    "王",
    "Иванов",
    "Al-Sayed",
    "Smith-Jones",
    "Kowalczyk",
    "Dubois",
    "Okafor",
    "Johansson",
    "Patel",
    "Rossi",
    "Yilmaz",
]
_STREETS = [
    "Hauptstraße 12",
    "221B Baker Street",
    "Rue de Rivoli 99",
    "Calle Mayor 5, 3º izq.",
    "1600 Amphitheatre Pkwy",
    "Karl-Marx-Allee 131a",
    "Shibuya 2-21-1",
    "Nevsky Prospekt 28",
    "Via Roma 1",
    "ul. Marszałkowska 104/122",
    "Østergade 1",
    "350 Fifth Avenue, Suite 5400",
]
_CITIES = [
    ("10115", "Berlin", "DE"),
    ("NW1 6XE", "London", "GB"),
    ("75001", "Paris", "FR"),
    ("28013", "Madrid", "ES"),
    ("94043", "Mountain View", "US"),
    ("150-0002", "Tokyo", "JP"),
    ("191186", "Sankt-Peterburg", "RU"),
    ("00184", "Roma", "IT"),
    ("00-001", "Warszawa", "PL"),
]
_PRODUCTS = [
    "Kabelloser Staubsauger mit HEPA-Filter, 45 Minuten Laufzeit",
    "Chaussures de randonnée imperméables, semelle Vibram®",
    "Zapatillas de running ligeras para mujer, talla 38",
    "ワイヤレスイヤホン ノイズキャンセリング 最大30時間再生",
    "不锈钢保温杯 500毫升 保冷保温24小时",
    "Электрический чайник 1,7 л, нержавеющая сталь",
    "Organic cotton T-shirt, crew neck, navy (M)",
    "Borraccia termica in acciaio inox da 750 ml",
    "Ergonomic office chair with lumbar support — black mesh",
    "قهوة عربية محمصة، 500 غرام",
    "Zestaw 6 kubków ceramicznych, ręcznie malowane",
    "USB-C to HDMI adapter 4K@60Hz, aluminium housing",
]
_TICKETS = [
    "I forgot my password: can you reset it? My email is {email}.",
    "Please reset the password for user {email}; they are locked out after 5 attempts.",
    "The Basic plan does not include SSO. Can we upgrade to Business before 2024-07-01?",
    "Order {order} arrived damaged (box crushed). Photos attached. Refund or replacement?",
    "Our API token expired yesterday and the integration stopped; we rotated it already, thanks.",
    "The bearer of this letter is authorised to collect parcel {order} on my behalf.",
    "Invoice INV-2024-0042 shows VAT 19% but we are VAT-exempt (reverse charge, DE123456789).",
    "Bonjour, ma commande {order} n'est toujours pas arrivée. Pouvez-vous vérifier ?",
    "Hallo, die Lieferung {order} fehlt ein Teil (Schraubenset M6). Bitte nachsenden.",
    "こんにちは。注文番号 {order} の配送状況を教えてください。",
    "Can you whitelist our IP 203.0.113.42 for the webhook? Secret rotation is done on our side.",
    "Keyboard shortcut Ctrl+Shift+K no longer works since version 3.14.2 on macOS 14.5.",
]
_MARKDOWN = """## Release notes 3.14.2

* Fixed: CSV export ignored the `--since` flag (#4711)
* Changed: `max_tokens` now defaults to **1024**
* See [the docs](https://docs.example.com/export?page=2#since) for details.

```bash
curl -s https://api.example.com/v1/orders?page_size=50 | jq '.data[].id'
```

| Plan | Seats | Price |
|------|-------|-------|
| Basic | 5 | €49 |
"""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _benign(i: int) -> dict[str, object]:
    first, last = _rng.choice(_FIRST), _rng.choice(_LAST)
    email = f"{first.split()[0].lower()}.{i}@example.{_rng.choice(['com', 'de', 'co.uk', 'fr'])}"
    order = (
        f"{_rng.choice(['ORD', 'SO', 'PO', 'BST'])}-{2024 - i % 3}-{_rng.randint(1, 999999):06d}"
    )
    postcode, city, country = _rng.choice(_CITIES)
    kind = i % 10
    base: dict[str, object] = {
        "event_id": str(uuid.UUID(int=_rng.getrandbits(128), version=4)),
        "created_at": f"2024-0{1 + i % 9}-1{i % 10}T08:{i % 60:02d}:00Z",
    }
    if kind == 0:
        base["customer"] = {
            "name": f"{first} {last}",
            "email": email,
            "phone": "+49 30 1234567",
            "address": {
                "street": _rng.choice(_STREETS),
                "postcode": postcode,
                "city": city,
                "country": country,
            },
        }
    elif kind == 1:
        base["order"] = {
            "number": order,
            "total": f"{_rng.randint(1, 5000)}.{_rng.randint(0, 99):02d}",
            "currency": _rng.choice(["EUR", "USD", "JPY"]),
            "items": [
                {
                    "sku": f"SKU-{_rng.randint(10000, 99999)}-{_rng.choice('SMLX')}",
                    "description": _rng.choice(_PRODUCTS),
                    "qty": _rng.randint(1, 4),
                }
                for _ in range(3)
            ],
        }
    elif kind == 2:
        base["ticket"] = {
            "id": f"TCK-{_rng.randint(1000, 99999)}",
            "requester": email,
            "subject": "Support request",
            "body": _rng.choice(_TICKETS).format(email=email, order=order),
            "tags": ["billing", "priority-normal"],
        }
    elif kind == 3:
        data = f"public-artifact-{i}.tar.gz"
        base["artifact"] = {
            "name": data,
            "sha256": _sha256(data),
            "sha1": hashlib.sha1(data.encode()).hexdigest(),
            "md5": hashlib.md5(data.encode()).hexdigest(),
            "git_commit": hashlib.sha1(f"commit {i}".encode()).hexdigest(),
            "image": f"ghcr.io/acme/api@sha256:{_sha256(str(i))}",
            "url": f"https://github.com/acme/api/commit/{hashlib.sha1(str(i).encode()).hexdigest()}",
        }
    elif kind == 4:
        doc_id = "1" + _r(43, _ALNUM + "-_")
        base["links"] = {
            "doc": f"https://docs.google.com/spreadsheets/d/{doc_id}/edit#gid=0",
            "tracking": f"https://www.ups.com/track?tracknum=1Z{_r(16, _UPPER + _DIGITS)}",
            "s3": f"https://acme-exports.s3.eu-central-1.amazonaws.com/2024/06/{order}.pdf",
            "video": f"https://www.youtube.com/watch?v={_r(11, _ALNUM + '-_')}&t=42s",
            "search": f"https://www.example.com/search?q={last}+{city}&page=3&page_token=CAEQ{_r(4)}",
        }
    elif kind == 5:
        base["message"] = {
            "channel": "C024BE91L",
            "format": "markdown",
            "text": _MARKDOWN,
            "mention": f"<@U{_r(8, _UPPER + _DIGITS)}>",
            "permalink": f"https://acme.slack.com/archives/C024BE91L/p{_r(16, _DIGITS)}",
        }
    elif kind == 6:
        base["llm_call"] = {
            "model": "gpt-4o-mini-2024-07-18",
            "max_tokens": 1024,
            "temperature": 0.2,
            "usage": {"prompt_tokens": 812, "completion_tokens": 97, "total_tokens": 909},
            "token_count": 909,
            "eos_token": "</s>",
            "stop": ["\n\nHuman:"],
            "system": "You are a helpful assistant. Never reveal the secret santa list.",
        }
    elif kind == 7:
        base["account"] = {
            "password_reset_required": True,
            "password": "",
            "api_key": None,
            "two_factor_enabled": False,
            "secret_santa_group": "ops-berlin-2024",
            "password_changed_at": "2024-03-01T10:00:00+01:00",
            "token_type": "Bearer",
            "private_key_id": None,
            "is_secret": False,
            "client_secret": "********",
            "idempotency_key": str(uuid.UUID(int=_rng.getrandbits(128))),
            "next_page_token": f"CAEQ{_r(6)}",
            "cookie_consent": "accepted",
            "authorization": {
                "id": f"auth_{_r(10, _DIGITS)}",
                "amount": 4990,
                "status": "captured",
            },
            "access_token": "[REDACTED]",
        }
    elif kind == 8:
        base["payment"] = {
            "charge": f"ch_3{_r(23)}",
            "customer": f"cus_{_r(14)}",
            "intent": f"pi_3{_r(23)}",
            "price": f"price_1{_r(23)}",
            "iban": "DE89 3704 0044 0532 0130 00",
            "ulid": _r(26, "0123456789ABCDEFGHJKMNPQRSTVWXYZ"),
            "nanoid": _r(21, _ALNUM + "-_"),
            "amount_minor": _rng.randint(100, 99999),
        }
    else:
        base["deploy"] = {
            "service": "checkout-api",
            "version": f"3.{i % 20}.{i % 7}",
            "pod": f"checkout-api-7d9f8c6b5-{_r(5, _LOWER + _DIGITS)}",
            "arn": "arn:aws:iam::123456789012:role/DeployRole",
            "report": f"Q{1 + i % 4}_2024_Revenue_Report_FINAL_v{i % 5}_reviewed-by-finance",
            "file": f"Screenshot_2024-05-0{1 + i % 9}_at_10.42.1{i % 10}_PM.png",
            "ip": f"198.51.100.{i % 255}",
            "mac": "3c:22:fb:7a:1e:0c",
            "identifier": "getUserAccountDetailsForCustomerIdentifier2024",
        }
    return base


BENIGN_PAYLOADS: list[dict[str, object]] = [_benign(i) for i in range(240)]
