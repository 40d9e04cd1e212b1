# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
