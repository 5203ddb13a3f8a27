"""Published credential formats: issuer prefixes, alphabets, lengths and checksums.

Each :class:`TokenFormat` is a declaration, not a hand-written regex: a sequence of parts
(a literal, or a run of an alphabet with a length range) from which the matching
expression is derived (and from which the corpus test generates tokens). The scan is one
pass of an Aho-Corasick automaton (``pyahocorasick``) over the text for every format's
literal *anchor* at once; only where an anchor occurs is that format's expression tried,
anchored at that place, and then its checksum where the issuer defines one:

* GitHub (``ghp_`` ``gho_`` ``ghu_`` ``ghs_``) and npm (``npm_``): the last six characters
  are the CRC32 of the thirty before them, in base62;
* age secret keys: Bech32 (BIP 173) with the human-readable part ``age-secret-key-``;
* tokens that carry JSON (Sentry organisation tokens, 1Password service accounts): the
  body decodes as base64url JSON.

A token is matched whole: not preceded by a letter or digit, and not followed by another
character of its last part's alphabet.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import string
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import ahocorasick

B62 = string.ascii_letters + string.digits
B64URL = B62 + "_-"
B64 = B62 + "+/"
HEX = "0123456789abcdef"
HEXU = "0123456789ABCDEF"
DIGITS = string.digits
UPPER_NUM = string.ascii_uppercase + string.digits
LOWER_NUM = string.ascii_lowercase + string.digits
BASE32 = string.ascii_uppercase + "234567"
BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_BASE62_ORDER = string.digits + string.ascii_uppercase + string.ascii_lowercase


@dataclass(frozen=True)
class Part:
    """A literal (``alphabet`` empty) or a run of ``alphabet`` ``low``..``high`` long."""

    text: str = ""
    alphabet: str = ""
    low: int = 0
    high: int = 0

    @property
    def fixed(self) -> int | None:
        if not self.alphabet:
            return len(self.text)
        return self.low if self.low == self.high else None

    def pattern(self) -> str:
        if not self.alphabet:
            return re.escape(self.text)
        return f"[{_charclass(self.alphabet)}]{{{self.low},{self.high}}}"


def lit(text: str) -> Part:
    return Part(text=text)


def run(alphabet: str, low: int, high: int | None = None) -> Part:
    return Part(alphabet=alphabet, low=low, high=low if high is None else high)


@dataclass(frozen=True)
class TokenFormat:
    name: str  # the detector name a finding reports
    issuer: str
    parts: tuple[Part, ...]
    anchor: int = 0  # the literal part the automaton looks for
    checksum: Callable[[str], bool] | None = None

    @property
    def anchor_text(self) -> str:
        return self.parts[self.anchor].text

    @property
    def lead(self) -> int:
        """Characters between the token's start and its anchor (parts before it are fixed)."""
        return sum(p.fixed or 0 for p in self.parts[: self.anchor])

    def expression(self) -> re.Pattern[str]:
        last = self.parts[-1]
        tail = f"(?![{_charclass(last.alphabet)}])" if last.alphabet else ""
        body = "".join(p.pattern() for p in self.parts)
        return re.compile(f"(?<![A-Za-z0-9]){body}{tail}")


def _charclass(alphabet: str) -> str:
    return "".join("\\" + c if c in "\\]^-" else c for c in alphabet)


def crc32_base62(token: str) -> bool:
    """GitHub's and npm's checksum: the last 6 characters, base62 (0-9A-Za-z), are the
    CRC32 of the 30 characters after the 4-character prefix."""
    body, check = token[4:-6], token[-6:]
    value = 0
    for char in check:
        value = value * 62 + _BASE62_ORDER.index(char)
    return value == zlib.crc32(body.encode("ascii"))


def bech32_valid(token: str) -> bool:
    """BIP 173: the human-readable part, ``1``, data, and a 6-character checksum."""
    lowered = token.lower()
    hrp, _, data = lowered.rpartition("1")
    if not hrp or len(data) < 7 or any(c not in BECH32 for c in data):
        return False
    values = [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]
    values += [BECH32.index(c) for c in data]
    return _bech32_polymod(values) == 1


def _bech32_polymod(values: list[int]) -> int:
    generators = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)
    checksum = 1
    for value in values:
        top = checksum >> 25
        checksum = (checksum & 0x1FFFFFF) << 5 ^ value
        for i, generator in enumerate(generators):
            if (top >> i) & 1:
                checksum ^= generator
    return checksum


def json_after(prefix_length: int) -> Callable[[str], bool]:
    """The token, after ``prefix_length`` characters, is base64url JSON (up to a ``_``)."""

    def valid(token: str) -> bool:
        body = token[prefix_length:].split("_", 1)[0]
        try:
            decoded = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            return isinstance(json.loads(decoded), dict)
        except (binascii.Error, ValueError):
            return False

    return valid


def _f(name: str, issuer: str, *parts: Part, anchor: int = 0,
       checksum: Callable[[str], bool] | None = None) -> TokenFormat:
    return TokenFormat(name, issuer, parts, anchor, checksum)


def _prefixed(name: str, issuer: str, prefix: str, alphabet: str, low: int,  # noqa: PLR0917
              high: int | None = None, checksum: Callable[[str], bool] | None = None
              ) -> TokenFormat:
    return _f(name, issuer, lit(prefix), run(alphabet, low, high), checksum=checksum)


_UUID = (run(HEX, 8), lit("-"), run(HEX, 4), lit("-"), run(HEX, 4), lit("-"), run(HEX, 4),
         lit("-"), run(HEX, 12))

FORMATS: tuple[TokenFormat, ...] = (
    # GitHub
    _prefixed("github_token", "GitHub personal access token", "ghp_", B62, 36,
              checksum=crc32_base62),
    _prefixed("github_token", "GitHub OAuth token", "gho_", B62, 36, checksum=crc32_base62),
    _prefixed("github_token", "GitHub user-to-server token", "ghu_", B62, 36,
              checksum=crc32_base62),
    _prefixed("github_token", "GitHub server-to-server token", "ghs_", B62, 36,
              checksum=crc32_base62),
    _prefixed("github_token", "GitHub refresh token", "ghr_", B62, 36, 80),
    _f("github_token", "GitHub fine-grained token", lit("github_pat_"), run(B62, 22),
       lit("_"), run(B62, 59)),
    # GitLab
    _prefixed("gitlab_token", "GitLab personal access token", "glpat-", B64URL + ".", 20, 80),
    _prefixed("gitlab_token", "GitLab pipeline trigger token", "glptt-", HEX, 40),
    _prefixed("gitlab_token", "GitLab runner registration token", "GR1348941", B64URL, 20),
    _prefixed("gitlab_token", "GitLab runner authentication token", "glrt-", B64URL + ".",
              20, 80),
    _prefixed("gitlab_token", "GitLab deploy token", "gldt-", B64URL, 20, 64),
    _prefixed("gitlab_token", "GitLab feed token", "glft-", B64URL, 20, 64),
    _prefixed("gitlab_token", "GitLab OAuth application secret", "gloas-", B64URL, 64),
    _prefixed("gitlab_token", "GitLab SCIM token", "glsoat-", B64URL, 20, 64),
    _prefixed("gitlab_token", "GitLab incoming mail token", "glimt-", B64URL, 25, 64),
    _prefixed("gitlab_token", "GitLab agent token", "glagent-", B64URL, 50, 100),
    _prefixed("gitlab_token", "GitLab feature flag client token", "glffct-", B64URL, 20, 64),
    _prefixed("gitlab_token", "GitLab CI/CD job token", "glcbt-", B64URL, 20, 80),
    # Package registries
    _prefixed("npm_token", "npm access token", "npm_", B62, 36, checksum=crc32_base62),
    _prefixed("pypi_token", "PyPI upload token", "pypi-AgEIcHlwaS5vcmc", B64URL, 50, 400),
    _prefixed("pypi_token", "TestPyPI upload token", "pypi-AgENdGVzdC5weXBpLm9yZw", B64URL,
              50, 400),
    _prefixed("rubygems_token", "RubyGems API key", "rubygems_", HEX, 48),
    _prefixed("clojars_token", "Clojars deploy token", "CLOJARS_", LOWER_NUM, 60),
    _prefixed("docker_hub_token", "Docker Hub personal access token", "dckr_pat_", B64URL,
              27, 40),
    _prefixed("docker_hub_token", "Docker Hub organisation access token", "dckr_oat_", B64URL,
              32, 40),
    _prefixed("jfrog_token", "JFrog API key", "AKCp", B62, 69),
    _prefixed("jfrog_token", "JFrog reference token", "cmVmdGtuOjAxOj", B64URL, 50, 80),
    # Chat and messaging
    _f("slack_token", "Slack bot token", lit("xoxb-"), run(DIGITS, 10, 13), lit("-"),
       run(DIGITS, 10, 13), lit("-"), run(B62, 24)),
    _f("slack_token", "Slack user token", lit("xoxp-"), run(DIGITS, 10, 13), lit("-"),
       run(DIGITS, 10, 13), lit("-"), run(DIGITS, 10, 13), lit("-"), run(HEX, 32)),
    _f("slack_token", "Slack app-level token", lit("xapp-"), run(DIGITS, 1), lit("-"),
       run(UPPER_NUM, 9, 12), lit("-"), run(DIGITS, 10, 13), lit("-"), run(HEX, 64)),
    _prefixed("slack_token", "Slack configuration token", "xoxe.xoxp-1-", B62, 140, 200),
    _prefixed("slack_token", "Slack configuration refresh token", "xoxe-1-", B62 + "-",
              140, 200),
    _prefixed("slack_token", "Slack legacy workspace token", "xoxa-2-", B62 + "-", 60, 200),
    _prefixed("slack_token", "Slack legacy token", "xoxs-", B62 + "-", 40, 200),
    _f("slack_webhook", "Slack incoming webhook", lit("hooks.slack.com/services/"), lit("T"),
       run(UPPER_NUM, 8, 12), lit("/B"), run(UPPER_NUM, 8, 12), lit("/"), run(B62, 24)),
    _f("discord_webhook", "Discord webhook", lit("discord.com/api/webhooks/"),
       run(DIGITS, 17, 20), lit("/"), run(B64URL, 60, 70)),
    _f("sendgrid_key", "SendGrid API key", lit("SG."), run(B64URL, 22), lit("."),
       run(B64URL, 43)),
    _f("mailchimp_key", "Mailchimp API key", run(HEX, 32), lit("-us"), run(DIGITS, 1, 2),
       anchor=1),
    _f("brevo_key", "Brevo (Sendinblue) API key", lit("xkeysib-"), run(HEX, 64), lit("-"),
       run(B62, 16)),
    _f("brevo_key", "Brevo (Sendinblue) SMTP key", lit("xsmtpsib-"), run(HEX, 64), lit("-"),
       run(B62, 16)),
    _prefixed("mailersend_key", "MailerSend API token", "mlsn.", HEX, 64),
    _f("resend_key", "Resend API key", lit("re_"), run(B62, 8), lit("_"), run(B62, 24)),
    _prefixed("twilio_key", "Twilio API key", "SK", HEX, 32),
    _f("postman_key", "Postman API key", lit("PMAK-"), run(HEX, 24), lit("-"), run(HEX, 34)),
    # Payments and commerce
    _prefixed("stripe_key", "Stripe live secret key", "sk_live_", B62, 24, 247),
    _prefixed("stripe_key", "Stripe test secret key", "sk_test_", B62, 24, 247),
    _prefixed("stripe_key", "Stripe live restricted key", "rk_live_", B62, 24, 247),
    _prefixed("stripe_key", "Stripe test restricted key", "rk_test_", B62, 24, 247),
    _prefixed("stripe_key", "Stripe webhook signing secret", "whsec_", B64, 32, 64),
    _prefixed("square_token", "Square access token", "EAAA", B64URL, 60),
    _prefixed("square_oauth", "Square OAuth secret", "sq0csp-", B64URL, 43),
    _prefixed("square_token", "Square legacy access token", "sq0atp-", B64URL, 22),
    _f("braintree_token", "Braintree access token", lit("access_token$production$"),
       run(LOWER_NUM, 16), lit("$"), run(HEX, 32)),
    _prefixed("shopify_token", "Shopify admin API access token", "shpat_", HEX, 32),
    _prefixed("shopify_token", "Shopify custom app access token", "shpca_", HEX, 32),
    _prefixed("shopify_token", "Shopify private app access token", "shppa_", HEX, 32),
    _prefixed("shopify_token", "Shopify shared secret", "shpss_", HEX, 32),
    _prefixed("easypost_key", "EasyPost production key", "EZAK", B62, 54),
    _prefixed("easypost_key", "EasyPost test key", "EZTK", B62, 54),
    _prefixed("shippo_token", "Shippo live token", "shippo_live_", HEX, 40),
    _prefixed("shippo_token", "Shippo test token", "shippo_test_", HEX, 40),
    _f("flutterwave_key", "Flutterwave secret key", lit("FLWSECK-"), run(HEX, 32),
       lit("-X")),
    _f("flutterwave_key", "Flutterwave test secret key", lit("FLWSECK_TEST-"), run(HEX, 32),
       lit("-X")),
    _f("plaid_token", "Plaid production access token", lit("access-production-"), *_UUID),
    _f("plaid_token", "Plaid development access token", lit("access-development-"), *_UUID),
    _prefixed("duffel_token", "Duffel live token", "duffel_live_", B64URL, 43),
    _prefixed("duffel_token", "Duffel test token", "duffel_test_", B64URL, 43),
    # Cloud and infrastructure
    _f("aws_access_key", "AWS access key id", lit("AKIA"), run(BASE32, 16)),
    _f("aws_access_key", "AWS temporary access key id", lit("ASIA"), run(BASE32, 16)),
    _f("aws_access_key", "AWS STS service bearer key id", lit("ABIA"), run(BASE32, 16)),
    _f("aws_access_key", "AWS context-specific key id", lit("ACCA"), run(BASE32, 16)),
    _prefixed("gcp_api_key", "Google API key", "AIza", B64URL, 35),
    _prefixed("gcp_oauth", "Google OAuth client secret", "GOCSPX-", B64URL, 28),
    _prefixed("gcp_oauth", "Google OAuth access token", "ya29.", B64URL, 20, 2048),
    _f("azure_ad_secret", "Microsoft Entra ID client secret", run(B62 + "_~.", 3),
       run(DIGITS, 1), lit("Q~"), run(B62 + "_~.-", 31, 34), anchor=2),
    _f("azure_devops_token", "Azure DevOps personal access token", run(B62, 76), lit("AZDO"),
       run(B62, 4), anchor=1),
    _prefixed("alibaba_key", "Alibaba Cloud AccessKey id", "LTAI", B62, 20),
    _prefixed("tencent_key", "Tencent Cloud SecretId", "AKID", B62, 32),
    _prefixed("yandex_key", "Yandex Cloud API key", "AQVN", B64URL, 35, 38),
    _prefixed("digitalocean_token", "DigitalOcean personal access token", "dop_v1_", HEX, 64),
    _prefixed("digitalocean_token", "DigitalOcean OAuth token", "doo_v1_", HEX, 64),
    _prefixed("digitalocean_token", "DigitalOcean refresh token", "dor_v1_", HEX, 64),
    _f("cloudflare_key", "Cloudflare Origin CA key", lit("v1.0-"), run(HEX, 24), lit("-"),
       run(HEX, 146)),
    _prefixed("databricks_token", "Databricks personal access token", "dapi", HEX, 32),
    _f("dynatrace_token", "Dynatrace API token", lit("dt0c01."), run(UPPER_NUM, 24), lit("."),
       run(UPPER_NUM, 64)),
    _prefixed("fly_token", "Fly.io organisation token", "fo1_", B64URL, 43),
    _prefixed("fly_token", "Fly.io macaroon token", "fm2_", B64 + "=_-", 100, 4096),
    _prefixed("vault_token", "HashiCorp Vault service token", "hvs.", B64URL, 90, 200),
    _prefixed("vault_token", "HashiCorp Vault batch token", "hvb.", B64URL, 138, 300),
    _f("terraform_token", "Terraform Cloud / HCP API token", run(B62, 14), lit(".atlasv1."),
       run(B64URL + "=", 60, 70), anchor=1),
    _prefixed("pulumi_token", "Pulumi access token", "pul-", HEX, 40),
    _prefixed("heroku_key", "Heroku API key", "HRKU-AA", B64URL, 58),
    _prefixed("planetscale_token", "PlanetScale service token", "pscale_tkn_", B64URL + ".",
              43),
    _prefixed("planetscale_token", "PlanetScale password", "pscale_pw_", B64URL + ".", 43),
    _prefixed("planetscale_token", "PlanetScale OAuth token", "pscale_oauth_", B64URL + ".",
              32, 64),
    _prefixed("supabase_key", "Supabase personal access token", "sbp_", HEX, 40),
    _prefixed("supabase_key", "Supabase secret key", "sb_secret_", B64URL, 31, 64),
    _prefixed("netlify_token", "Netlify personal access token", "nfp_", B62, 36),
    _prefixed("render_key", "Render API key", "rnd_", B62, 32),
    _prefixed("vercel_token", "Vercel personal token", "vcp_", B62, 24, 64),
    _prefixed("tailscale_key", "Tailscale auth key", "tskey-auth-", B62 + "-", 30, 80),
    _prefixed("tailscale_key", "Tailscale API key", "tskey-api-", B62 + "-", 30, 80),
    _prefixed("tailscale_key", "Tailscale OAuth client secret", "tskey-client-", B62 + "-",
              30, 80),
    _prefixed("doppler_token", "Doppler personal token", "dp.pt.", B62, 43),
    _prefixed("doppler_token", "Doppler service token", "dp.st.", B62 + "._-", 43, 90),
    _prefixed("doppler_token", "Doppler CLI token", "dp.ct.", B62, 43),
    _prefixed("doppler_token", "Doppler service account token", "dp.sa.", B62, 43),
    _prefixed("doppler_token", "Doppler SCIM token", "dp.scim.", B62, 43),
    _prefixed("doppler_token", "Doppler audit token", "dp.audit.", B62, 43),
    _prefixed("onepassword_token", "1Password service account token", "ops_eyJ", B64URL, 100,
              2000, checksum=json_after(4)),
    _f("onepassword_key", "1Password secret key", lit("A3-"), run(UPPER_NUM, 6), lit("-"),
       run(UPPER_NUM, 6), lit("-"), run(UPPER_NUM, 5), lit("-"), run(UPPER_NUM, 5), lit("-"),
       run(UPPER_NUM, 5), lit("-"), run(UPPER_NUM, 5)),
    _f("age_secret_key", "age secret key", lit("AGE-SECRET-KEY-1"), run(BECH32.upper(), 58),
       checksum=bech32_valid),
    # Developer tools and observability
    _f("atlassian_token", "Atlassian API token", lit("ATATT3"), run(B64URL + "=", 180, 200)),
    _prefixed("bitbucket_token", "Bitbucket app password", "ATBB", B62, 32, 40),
    _prefixed("sentry_token", "Sentry user auth token", "sntryu_", HEX, 64),
    _prefixed("sentry_token", "Sentry organisation auth token", "sntrys_eyJ", B64URL, 60, 400,
              checksum=json_after(7)),
    _prefixed("grafana_token", "Grafana Cloud API token", "glc_", B64 + "=", 32, 400),
    _f("grafana_token", "Grafana service account token", lit("glsa_"), run(B62, 32), lit("_"),
       run(HEX, 8)),
    _prefixed("newrelic_key", "New Relic user API key", "NRAK-", UPPER_NUM, 27),
    _prefixed("newrelic_key", "New Relic insights insert key", "NRII-", B64URL, 32),
    _prefixed("newrelic_key", "New Relic browser API token", "NRJS-", HEX, 19),
    _f("newrelic_key", "New Relic license key", run(HEX, 36), lit("NRAL"), anchor=1),
    _prefixed("honeycomb_key", "Honeycomb ingest key", "hcaik_", LOWER_NUM, 58),
    _prefixed("honeycomb_key", "Honeycomb configuration key", "hcxik_", LOWER_NUM, 58),
    _prefixed("posthog_key", "PostHog personal API key", "phx_", B62, 43),
    _prefixed("sonarqube_token", "SonarQube user token", "squ_", HEX, 40),
    _prefixed("sonarqube_token", "SonarQube project analysis token", "sqp_", HEX, 40),
    _prefixed("sonarqube_token", "SonarQube global analysis token", "sqa_", HEX, 40),
    _prefixed("buildkite_token", "Buildkite API token", "bkua_", HEX, 40),
    _f("circleci_token", "CircleCI personal API token", lit("CCIPAT_"), run(B62, 22), lit("_"),
       run(HEX, 40)),
    _prefixed("octopus_key", "Octopus Deploy API key", "API-", UPPER_NUM, 26, 32),
    _prefixed("readme_key", "ReadMe API key", "rdme_", HEX, 70),
    _prefixed("scalingo_token", "Scalingo API token", "tk-us-", B64URL, 48),
    _prefixed("prefect_key", "Prefect API key", "pnu_", B62, 36),
    _prefixed("linear_key", "Linear API key", "lin_api_", B62, 40),
    _prefixed("notion_token", "Notion integration token", "secret_", B62, 43),
    _f("notion_token", "Notion API token", lit("ntn_"), run(DIGITS, 11), run(B62, 35)),
    _f("airtable_token", "Airtable personal access token", lit("pat"), run(B62, 14), lit("."),
       run(HEX, 64)),
    _prefixed("figma_token", "Figma personal access token", "figd_", B64URL, 40),
    _prefixed("contentful_token", "Contentful personal access token", "CFPAT-", B64URL, 43),
    _prefixed("typeform_token", "Typeform personal access token", "tfp_", B64URL + ".", 59),
    _prefixed("frameio_token", "Frame.io developer token", "fio-u-", B64URL, 64),
    _prefixed("adafruit_key", "Adafruit IO key", "aio_", B62, 28),
    _prefixed("mapbox_token", "Mapbox secret token", "sk.eyJ", B64URL + ".", 80, 300),
    _prefixed("dropbox_token", "Dropbox short-lived access token", "sl.", B64URL, 130, 1400),
    _prefixed("infracost_key", "Infracost API key", "ico-", B62, 32),
    _prefixed("adobe_secret", "Adobe client secret", "p8e-", B64URL, 32),
    _f("harness_token", "Harness personal access token", lit("pat."), run(B64URL, 22),
       lit("."), run(HEX, 24), lit("."), run(B62, 20)),
    _f("firebase_key", "Firebase Cloud Messaging server key", lit("AAAA"), run(B64URL, 7),
       lit(":"), run(B64URL, 140)),
    _prefixed("twitter_token", "X (Twitter) app bearer token", "AAAAAAAAAAAAAAAAAAAAA",
              B62 + "%", 50, 120),
    _prefixed("facebook_token", "Facebook (Meta) access token", "EAAB", B62, 90, 400),
    _prefixed("facebook_token", "Facebook (Meta) page/system user token", "EAAG", B62, 90,
              400),
    # AI providers
    _prefixed("openai_key", "OpenAI project key", "sk-proj-", B64URL, 40, 200),
    _prefixed("openai_key", "OpenAI service account key", "sk-svcacct-", B64URL, 40, 200),
    _prefixed("openai_key", "OpenAI admin key", "sk-admin-", B64URL, 40, 200),
    _f("openai_key", "OpenAI legacy key", lit("sk-"), run(B62, 20), lit("T3BlbkFJ"),
       run(B62, 20)),
    _prefixed("anthropic_key", "Anthropic API key", "sk-ant-api03-", B64URL, 80, 120),
    _prefixed("anthropic_key", "Anthropic admin key", "sk-ant-admin01-", B64URL, 80, 120),
    _prefixed("huggingface_token", "Hugging Face access token", "hf_", string.ascii_letters,
              34),
    _prefixed("huggingface_token", "Hugging Face organisation token", "api_org_",
              string.ascii_letters, 34),
    _prefixed("replicate_token", "Replicate API token", "r8_", B62, 37),
    _prefixed("groq_key", "Groq API key", "gsk_", B62, 52),
    _prefixed("perplexity_key", "Perplexity API key", "pplx-", B62, 48),
    _prefixed("xai_key", "xAI API key", "xai-", B62, 80),
    _prefixed("openrouter_key", "OpenRouter API key", "sk-or-v1-", HEX, 64),
    _f("langsmith_key", "LangSmith personal token", lit("lsv2_pt_"), run(HEX, 32), lit("_"),
       run(HEX, 10)),
    _f("langsmith_key", "LangSmith service key", lit("lsv2_sk_"), run(HEX, 32), lit("_"),
       run(HEX, 10)),
    _f("langfuse_key", "Langfuse secret key", lit("sk-lf-"), *_UUID),
    _prefixed("pinecone_key", "Pinecone API key", "pcsk_", B62 + "_", 60, 100),
)


class TokenScanner:
    """Every format's anchor in one automaton; :meth:`find` names the first format whose
    token occurs in a text."""

    def __init__(self, formats: tuple[TokenFormat, ...] = FORMATS) -> None:
        self.formats = formats
        by_anchor: dict[str, list[tuple[TokenFormat, re.Pattern[str]]]] = {}
        for fmt in formats:
            by_anchor.setdefault(fmt.anchor_text, []).append((fmt, fmt.expression()))
        automaton = ahocorasick.Automaton()
        for anchor, entries in by_anchor.items():
            automaton.add_word(anchor, (len(anchor), tuple(entries)))
        automaton.make_automaton()
        self._automaton = automaton
        #: The shortest token of any format: each lies in a whitespace-free word this long.
        self.shortest = min(sum(p.fixed if p.fixed is not None else p.low for p in f.parts)
                            for f in formats)

    def matches(self, text: str) -> Iterator[tuple[TokenFormat, str]]:
        for end, (length, entries) in self._automaton.iter(text):
            anchor_start = end - length + 1
            for fmt, expression in entries:
                start = anchor_start - fmt.lead
                if start < 0:
                    continue
                found = expression.match(text, start)
                if found and (fmt.checksum is None or fmt.checksum(found.group(0))):
                    yield fmt, found.group(0)

    def find(self, text: str) -> str | None:
        if not text:
            return None
        for fmt, _ in self.matches(text):
            return fmt.name
        return None


SCANNER = TokenScanner()
