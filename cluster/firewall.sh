#!/usr/bin/env bash
# Host firewall rules for a raysim cluster on your own machines (cluster/README.md, "Firewall on
# your own machines"). Prints them; changes nothing. Inbound, on every host of the cluster:
#   - Ray's ports (those start-head.sh and start-worker.sh pin, common.sh) from the cluster's
#     hosts only;
#   - SSH from the cluster's hosts (the launcher on the head reaches the workers) and from you;
#   - the dashboard and job server (8265) from you only: it listens on the head's loopback, so
#     this matters only if you move it off loopback; the SSH tunnel is the way in;
#   - loopback, replies to connections this host opened, ICMP;
#   - nothing else: every other inbound connection is dropped, other services' too.
#
#   bash cluster/firewall.sh --hosts 10.0.0.10,10.0.0.11,10.0.0.12 --operator 203.0.113.7 >raysim.nft
#   sudo nft -f raysim.nft          # on each host; `sudo nft delete table inet raysim` undoes it
#   bash cluster/firewall.sh --ufw --hosts ... --operator ...    # the same as ufw commands
#
# Addresses are IPv4 or IPv6, each optionally a prefix (10.0.0.0/24), comma-separated.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage="usage: $0 [--ufw] --hosts ADDR[,ADDR...] --operator ADDR[,ADDR...]"
format=nft hosts="" operator=""
while (($#)); do
  case $1 in
    --hosts) hosts=${2:?$usage} && shift 2 ;;
    --operator) operator=${2:?$usage} && shift 2 ;;
    --ufw) format=ufw && shift ;;
    -h | --help) echo "$usage" && exit 0 ;;
    *) echo "$usage" >&2 && exit 2 ;;
  esac
done
if [[ -z $hosts || -z $operator ]]; then
  echo "$usage" >&2
  exit 2
fi

# an address or prefix, IPv4 or IPv6; anything else (a name, a space, a ';') is refused
split() {
  local IFS=, a
  for a in $1; do
    if [[ ! $a =~ ^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$ || ! $a =~ [.:] ]]; then
      echo "$0: not an IP address or prefix: '$a'" >&2
      return 2
    fi
    echo "$a"
  done
}
split "$hosts" >/dev/null && split "$operator" >/dev/null || exit 2
mapfile -t HOSTS < <(split "$hosts")
mapfile -t OPERATOR < <(split "$operator")

# Ray's ports, from the flags the start scripts pass: single ports and the workers' range
ports=("$RAY_GCS_PORT" "$RAY_CLIENT_SERVER_PORT")
for flag in "${RAY_NODE_PORTS[@]}"; do
  case $flag in
    --min-worker-port=*) lo=${flag#*=} ;;
    --max-worker-port=*) hi=${flag#*=} ;;
    --*-port=*) ports+=("${flag#*=}") ;;
  esac
done
mapfile -t ports < <(printf '%s\n' "${ports[@]}" | sort -n)

family() { [[ $1 == *:* ]] && echo ip6 || echo ip; }

if [[ $format == nft ]]; then
  join() {
    local IFS=,
    echo "$*"
  }
  v4=() v6=() op4=() op6=()
  for a in "${HOSTS[@]}"; do [[ $(family "$a") == ip ]] && v4+=("$a") || v6+=("$a"); done
  for a in "${OPERATOR[@]}"; do [[ $(family "$a") == ip ]] && op4+=("$a") || op6+=("$a"); done
  echo "#!/usr/sbin/nft -f"
  echo "# raysim: made by cluster/firewall.sh --hosts $hosts --operator $operator"
  echo "# Replaces the table inet raysim only; drops every inbound connection it does not name."
  echo "table inet raysim {}"
  echo "delete table inet raysim"
  echo "table inet raysim {"
  ((${#v4[@]})) && echo "  set cluster4 { type ipv4_addr; flags interval; elements = { $(join "${v4[@]}") } }"
  ((${#v6[@]})) && echo "  set cluster6 { type ipv6_addr; flags interval; elements = { $(join "${v6[@]}") } }"
  ((${#op4[@]})) && echo "  set operator4 { type ipv4_addr; flags interval; elements = { $(join "${op4[@]}") } }"
  ((${#op6[@]})) && echo "  set operator6 { type ipv6_addr; flags interval; elements = { $(join "${op6[@]}") } }"
  echo "  chain input {"
  echo "    type filter hook input priority filter; policy drop;"
  echo "    ct state established,related accept"
  echo "    ct state invalid drop"
  echo "    iif lo accept"
  echo "    meta l4proto { icmp, ipv6-icmp } accept"
  ray="tcp dport { $(join "${ports[@]}"), $lo-$hi } accept"
  ((${#v4[@]})) && echo "    ip saddr @cluster4 $ray    # Ray, between the cluster's hosts"
  ((${#v6[@]})) && echo "    ip6 saddr @cluster6 $ray"
  ((${#v4[@]})) && echo "    ip saddr @cluster4 tcp dport 22 accept"
  ((${#v6[@]})) && echo "    ip6 saddr @cluster6 tcp dport 22 accept"
  ((${#op4[@]})) && echo "    ip saddr @operator4 tcp dport { 22, $RAY_DASHBOARD_PORT } accept    # you: SSH, dashboard"
  ((${#op6[@]})) && echo "    ip6 saddr @operator6 tcp dport { 22, $RAY_DASHBOARD_PORT } accept"
  echo "  }"
  echo "}"
else
  list=$(
    IFS=,
    echo "${ports[*]},$lo:$hi"
  )
  echo "# raysim: made by cluster/firewall.sh --ufw --hosts $hosts --operator $operator"
  echo "# Run these as root on each host; the last one turns ufw on (check the SSH rule first)."
  echo "ufw default deny incoming"
  echo "ufw default allow outgoing"
  for a in "${OPERATOR[@]}"; do
    echo "ufw allow proto tcp from $a to any port 22,$RAY_DASHBOARD_PORT comment 'raysim: you'"
  done
  for a in "${HOSTS[@]}"; do
    echo "ufw allow proto tcp from $a to any port 22 comment 'raysim: SSH between hosts'"
    echo "ufw allow proto tcp from $a to any port $list comment 'raysim: Ray'"
  done
  echo "ufw --force enable"
fi
